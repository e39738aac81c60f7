//! BufferedWriter behaviour (SPEC §4.2, PIP-160 test plan) over test sinks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod writer_support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;
use txnstream_core::frame::{decode_entry, is_batched};
use txnstream_core::writer::{BufferedWriter, WriterConfig, WriterStats};
use txnstream_core::{Error, TxnPosition};
use writer_support::*;

const HOUR: Duration = Duration::from_secs(3600);

fn cfg(max_records: u32, max_size: usize, max_delay: Duration) -> WriterConfig {
    WriterConfig {
        max_records,
        max_size,
        max_delay,
        batch_enabled: true,
    }
}

fn writer(sink: &Arc<MemSink>, c: WriterConfig) -> BufferedWriter {
    BufferedWriter::new(sink.as_sink(), c, Some("test".into())).unwrap()
}

/// Writes `records` one by one, tagging completions with their index.
fn write_all(w: &BufferedWriter, col: &Collector, records: &[Vec<u8>]) {
    for (i, r) in records.iter().enumerate() {
        w.write(r, col.callback(i)).unwrap();
    }
}

fn ok_positions(got: &[(usize, txnstream_core::Result<TxnPosition>)]) -> Vec<TxnPosition> {
    got.iter()
        .enumerate()
        .map(|(k, (tag, r))| {
            assert_eq!(*tag, k, "completions out of submission order");
            r.clone().unwrap()
        })
        .collect()
}

/// Every record read back from the sink at its position equals what was written.
fn assert_read_back(sink: &MemSink, records: &[Vec<u8>], positions: &[TxnPosition]) {
    let entries = sink.entries();
    for (r, p) in records.iter().zip(positions) {
        let e = &entries[p.position.entry_id as usize];
        let recs = decode_entry(e).unwrap();
        assert_eq!(recs.len() as u32, p.batch_size);
        assert_eq!(recs[p.batch_index as usize], r.as_slice());
        assert_eq!(is_batched(e), p.batch_size > 1 || is_batched(e));
    }
}

fn triggers(s: &WriterStats) -> [u64; 5] {
    [
        s.flush_max_records,
        s.flush_max_size,
        s.flush_max_delay,
        s.flush_large_data,
        s.flush_forced,
    ]
}

#[test]
fn max_records_triggers_flush() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(4, 1 << 20, HOUR));
    let col = Collector::default();
    let recs: Vec<_> = (0..12).map(|i| rec(i, 10)).collect();
    write_all(&w, &col, &recs);
    let pos = ok_positions(&col.wait(12));
    let want: Vec<_> = (0..12).map(|i| tp(i / 4, 4, (i % 4) as u32)).collect();
    assert_eq!(pos, want);
    assert_read_back(&sink, &recs, &pos);
    let s = w.stats();
    assert_eq!(triggers(&s), [3, 0, 0, 0, 0]);
    assert_eq!((s.entries, s.batched_entries, s.records), (3, 3, 12));
    assert_eq!(s.bytes, sink.entries().iter().map(|e| e.len() as u64).sum());
}

#[test]
fn max_size_triggers_flush() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(1000, 100, HOUR));
    let col = Collector::default();
    // 30-byte records: the 4th brings the batch to 120 >= 100 bytes.
    let recs: Vec<_> = (0..8).map(|i| rec(i, 30)).collect();
    write_all(&w, &col, &recs);
    let pos = ok_positions(&col.wait(8));
    assert_eq!(pos[3], tp(0, 4, 3));
    assert_eq!(pos[4], tp(1, 4, 0));
    assert_read_back(&sink, &recs, &pos);
    assert_eq!(triggers(&w.stats()), [0, 2, 0, 0, 0]);
}

#[test]
fn max_delay_triggers_flush_from_first_record() {
    let sink = MemSink::new();
    let delay = Duration::from_millis(3);
    let w = writer(&sink, cfg(1000, 1 << 20, delay));
    let col = Collector::default();
    let recs: Vec<_> = (0..3).map(|i| rec(i, 10)).collect();
    write_all(&w, &col, &recs);
    // Completion can only come from the timer: no other threshold is near.
    let pos = ok_positions(&col.wait(3));
    assert_eq!(pos, vec![tp(0, 3, 0), tp(0, 3, 1), tp(0, 3, 2)]);
    let s = w.stats();
    assert_eq!(triggers(&s), [0, 0, 1, 0, 0]);
    // The oldest record waited at least max_delay before the batch was written.
    assert_eq!(s.oldest_record_delay.count, 1);
    assert!(s.oldest_record_delay.sum >= delay.as_secs_f64());
}

#[test]
fn zero_delay_writes_at_end_of_each_call() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(1000, 1 << 20, Duration::ZERO));
    let col = Collector::default();
    write_all(&w, &col, &[rec(0, 5), rec(1, 5)]);
    let slot = ManySlot::default();
    w.write_many(&[rec(2, 5), rec(3, 5), rec(4, 5)], slot.callback())
        .unwrap();
    let pos = ok_positions(&col.wait(2));
    assert_eq!(pos, vec![tp(0, 1, 0), tp(1, 1, 0)]);
    assert_eq!(
        slot.wait().unwrap(),
        vec![tp(2, 3, 0), tp(2, 3, 1), tp(2, 3, 2)]
    );
    assert_eq!(triggers(&w.stats()), [0, 0, 3, 0, 0]);
}

#[test]
fn large_record_flushes_batch_then_goes_alone() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(1000, 100, HOUR));
    let col = Collector::default();
    let recs = vec![rec(0, 10), rec(1, 10), rec(2, 100), rec(3, 500), rec(4, 10)];
    write_all(&w, &col, &recs);
    w.flush();
    let pos = ok_positions(&col.wait(5));
    let plain = |e| TxnPosition::single(txnstream_core::Position::new(1, e));
    assert_eq!(
        pos,
        vec![tp(0, 2, 0), tp(0, 2, 1), plain(1), plain(2), tp(3, 1, 0)]
    );
    let entries = sink.entries();
    // The large records are stored bare: no batch framing.
    assert_eq!(entries[1], recs[2]);
    assert_eq!(entries[2], recs[3]);
    assert!(is_batched(&entries[0]) && is_batched(&entries[3]));
    assert_read_back(&sink, &recs, &pos);
    let s = w.stats();
    // Two large records; the first flushed a pending batch, the second found none.
    assert_eq!(triggers(&s), [0, 0, 0, 2, 1]);
    assert_eq!((s.entries, s.batched_entries), (4, 2));
}

#[test]
fn batches_of_one_and_two() {
    // max_records = 1: batching is not in effect, every record goes alone.
    let sink = MemSink::new();
    let w = writer(&sink, cfg(1, 1 << 20, HOUR));
    let col = Collector::default();
    let recs: Vec<_> = (0..3).map(|i| rec(i, 8)).collect();
    write_all(&w, &col, &recs);
    let pos = ok_positions(&col.wait(3));
    assert_eq!(pos, vec![tp(0, 1, 0), tp(1, 1, 0), tp(2, 1, 0)]);
    assert_eq!(sink.entries(), recs);
    assert_eq!(triggers(&w.stats()), [0; 5]);

    let sink = MemSink::new();
    let w = writer(&sink, cfg(2, 1 << 20, HOUR));
    let col = Collector::default();
    let recs: Vec<_> = (0..5).map(|i| rec(i, 8)).collect();
    write_all(&w, &col, &recs);
    w.flush();
    let pos = ok_positions(&col.wait(5));
    assert_eq!(
        pos,
        vec![
            tp(0, 2, 0),
            tp(0, 2, 1),
            tp(1, 2, 0),
            tp(1, 2, 1),
            tp(2, 1, 0)
        ]
    );
    assert_read_back(&sink, &recs, &pos);
    // A batch of one record written while batching is on is still framed.
    assert!(is_batched(&sink.entries()[2]));
    assert_eq!(triggers(&w.stats()), [2, 0, 0, 0, 1]);
}

#[test]
fn batching_off_writes_bare_entries() {
    let sink = MemSink::new();
    let mut c = cfg(512, 1 << 20, HOUR);
    c.batch_enabled = false;
    let w = writer(&sink, c);
    let col = Collector::default();
    let recs: Vec<_> = (0..4).map(|i| rec(i, 20)).collect();
    write_all(&w, &col, &recs);
    let pos = ok_positions(&col.wait(4));
    assert_eq!(pos, (0..4).map(|e| tp(e, 1, 0)).collect::<Vec<_>>());
    assert_eq!(sink.entries(), recs);
    let s = w.stats();
    assert_eq!(triggers(&s), [0; 5]);
    assert_eq!((s.entries, s.batched_entries, s.records), (4, 0, 4));
    assert_eq!(s.batch_records.count, 0);
}

#[test]
fn always_failing_storage_fails_every_record() {
    for batching in [true, false] {
        let sink = MemSink::failing(Box::new(|_| true));
        let mut c = cfg(3, 1 << 20, HOUR);
        c.batch_enabled = batching;
        let w = writer(&sink, c);
        let col = Collector::default();
        let recs: Vec<_> = (0..6).map(|i| rec(i, 8)).collect();
        write_all(&w, &col, &recs);
        let slot = ManySlot::default();
        w.write_many(&recs, slot.callback()).unwrap();
        w.flush();
        let got = col.wait(6);
        for (k, (tag, r)) in got.iter().enumerate() {
            assert_eq!(*tag, k);
            let want_entry = if batching { k / 3 } else { k } as u64;
            assert_eq!(r.clone().unwrap_err(), io_error(want_entry), "{batching}");
        }
        assert!(matches!(slot.wait(), Err(Error::Io { .. })));
        let s = w.stats();
        assert_eq!((s.entries, s.records, s.failed_records), (0, 0, 12));
        assert_eq!(s.failed_entries, if batching { 4 } else { 12 });
        assert!(sink.entries().is_empty());
    }
}

#[test]
fn sometimes_failing_storage_fails_whole_batches() {
    for batching in [true, false] {
        // Every second append fails.
        let sink = MemSink::failing(Box::new(|n| n % 2 == 1));
        let mut c = cfg(3, 1 << 20, HOUR);
        c.batch_enabled = batching;
        let w = writer(&sink, c);
        let col = Collector::default();
        let recs: Vec<_> = (0..12).map(|i| rec(i, 8)).collect();
        write_all(&w, &col, &recs);
        let got = col.wait(12);
        let per = if batching { 3 } else { 1 };
        let mut ok = (Vec::new(), Vec::new());
        for (k, (tag, r)) in got.iter().enumerate() {
            assert_eq!(*tag, k, "order");
            let append_no = (k / per) as u64;
            if append_no % 2 == 1 {
                // Same error for every record of the failed batch.
                assert_eq!(r.clone().unwrap_err(), io_error(append_no));
            } else {
                let p = r.clone().unwrap();
                assert_eq!(p.batch_size as usize, per);
                assert_eq!(p.batch_index as usize, k % per);
                ok.0.push(recs[k].clone());
                ok.1.push(p);
            }
        }
        // Failed entries take no id; the durable ones read back intact.
        assert_eq!(sink.entries().len(), if batching { 2 } else { 6 });
        assert_read_back(&sink, &ok.0, &ok.1);
        let s = w.stats();
        assert_eq!((s.records, s.failed_records), (6, 6));
    }
}

#[test]
fn close_mid_stream() {
    let sink = MemSink::gated();
    let w = writer(&sink, cfg(2, 1 << 20, HOUR));
    let col = Collector::default();
    let recs: Vec<_> = (0..5).map(|i| rec(i, 8)).collect();
    write_all(&w, &col, &recs);
    let slot = ManySlot::default();
    w.write_many(&[rec(5, 8)], slot.callback()).unwrap(); // joins record 4's batch
    assert_eq!(sink.appended().len(), 3); // (0,1) (2,3) (4,5): all flushed by max_records
    let slot2 = ManySlot::default();
    w.write_many(&[rec(6, 8)], slot2.callback()).unwrap(); // pending, not flushed
    let late = Collector::default();
    w.write(&rec(7, 8), late.callback(7)).unwrap(); // flushes (6, 7)
    assert_eq!(sink.appended().len(), 4);
    w.write(&rec(8, 8), late.callback(8)).unwrap(); // pending
    w.close();
    // The pending record failed at once with WriterClosed.
    let got = late.wait(1);
    assert_eq!(got[0].0, 8);
    assert!(matches!(got[0].1, Err(Error::WriterClosed(ref n)) if n == "test"));
    // Writes after close fail at once and never call back.
    let after = Collector::default();
    assert!(matches!(
        w.write(b"x", after.callback(0)),
        Err(Error::WriterClosed(_))
    ));
    assert!(matches!(
        w.write_many(&[b"x"], ManySlot::default().callback()),
        Err(Error::WriterClosed(_))
    ));
    // Entries already handed to storage complete normally.
    assert!(!w.wait_idle(Some(Duration::from_millis(1))));
    sink.release(10);
    assert!(w.wait_idle(Some(Duration::from_secs(10))));
    let pos = ok_positions(&col.wait(5));
    assert_eq!(pos[4], tp(2, 2, 0));
    assert_eq!(slot.wait().unwrap(), vec![tp(2, 2, 1)]);
    assert_eq!(slot2.wait().unwrap(), vec![tp(3, 2, 0)]);
    assert_eq!(late.wait(2)[1].1.clone().unwrap(), tp(3, 2, 1));
    assert_eq!(after.len(), 0);
    let s = w.stats();
    assert_eq!(
        (s.records, s.closed_records, s.in_flight_entries),
        (8, 1, 0)
    );
    w.close(); // idempotent
}

#[test]
fn switching_batching_mid_stream() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(100, 1 << 20, HOUR));
    let col = Collector::default();
    let recs: Vec<_> = (0..8).map(|i| rec(i, 6)).collect();
    w.write(&recs[0], col.callback(0)).unwrap();
    w.write(&recs[1], col.callback(1)).unwrap();
    w.set_batch_enabled(false); // writes (0, 1) now
    assert!(!w.batch_enabled());
    w.write(&recs[2], col.callback(2)).unwrap();
    w.write(&recs[3], col.callback(3)).unwrap();
    w.set_batch_enabled(true);
    w.write(&recs[4], col.callback(4)).unwrap();
    w.write(&recs[5], col.callback(5)).unwrap();
    // Off again via reconfigure, then a record that goes alone.
    w.reconfigure(WriterConfig {
        batch_enabled: false,
        ..w.config()
    })
    .unwrap();
    w.write(&recs[6], col.callback(6)).unwrap();
    w.set_batch_enabled(true);
    w.write(&recs[7], col.callback(7)).unwrap();
    w.flush();
    let pos = ok_positions(&col.wait(8));
    assert_eq!(
        pos,
        vec![
            tp(0, 2, 0),
            tp(0, 2, 1),
            tp(1, 1, 0),
            tp(2, 1, 0),
            tp(3, 2, 0),
            tp(3, 2, 1),
            tp(4, 1, 0),
            tp(5, 1, 0),
        ]
    );
    let e = sink.entries();
    assert_eq!(e[1], recs[2]);
    assert_eq!(e[4], recs[6]);
    assert!(is_batched(&e[0]) && is_batched(&e[3]) && is_batched(&e[5]));
    assert_read_back(&sink, &recs, &pos);
    // Switching off twice and the final flush() each wrote a batch.
    assert_eq!(triggers(&w.stats()), [0, 0, 0, 0, 3]);
}

#[test]
fn reconfigure_applies_to_current_batch() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(100, 1 << 20, HOUR));
    let col = Collector::default();
    write_all(&w, &col, &(0..5).map(|i| rec(i, 6)).collect::<Vec<_>>());
    assert!(w.reconfigure(cfg(0, 1, HOUR)).is_err());
    w.reconfigure(cfg(4, 1 << 20, HOUR)).unwrap(); // 5 >= 4: written now
    col.wait(5);
    assert_eq!(triggers(&w.stats()), [1, 0, 0, 0, 0]);
    w.write(&rec(5, 6), col.callback(5)).unwrap();
    w.reconfigure(cfg(4, 1 << 20, Duration::from_millis(1)))
        .unwrap();
    col.wait(6);
    assert_eq!(triggers(&w.stats()), [1, 0, 1, 0, 0]);
}

#[test]
fn write_many_spans_entries_and_reads_back() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(64, 4096, Duration::from_millis(1)));
    // Mix in records >= max_size: they go alone, in order.
    let recs: Vec<_> = (0..1000)
        .map(|i| rec(i, if i % 250 == 7 { 5000 } else { 20 + i % 13 }))
        .collect();
    let slot = ManySlot::default();
    w.write_many(&recs, slot.callback()).unwrap();
    let pos = slot.wait().unwrap();
    assert_eq!(pos.len(), 1000);
    assert_read_back(&sink, &recs, &pos);
    // Positions never go backwards and batch indexes count up inside an entry.
    for pair in pos.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.position == b.position {
            assert_eq!(b.batch_index, a.batch_index + 1);
        } else {
            assert!(b.position > a.position && b.batch_index == 0);
        }
    }
    let s = w.stats();
    assert_eq!(s.flush_large_data, 4);
    assert_eq!(s.records, 1000);
    let e = sink.entries();
    let flat: Vec<Vec<u8>> = e
        .iter()
        .flat_map(|e| decode_entry(e).unwrap().into_iter().map(<[u8]>::to_vec))
        .collect();
    assert_eq!(flat, recs, "log order equals submission order");
    let empty = ManySlot::default();
    w.write_many::<Vec<u8>>(&[], empty.callback()).unwrap();
    assert_eq!(empty.wait().unwrap(), vec![]);
}

#[test]
fn inline_completion_may_write_again_without_deadlock() {
    let sink = MemSink::inline();
    let w = Arc::new(writer(&sink, cfg(2, 1 << 20, HOUR)));
    let col = Collector::default();
    let w2 = Arc::clone(&w);
    let col2 = col.clone();
    w.write(
        b"a",
        Box::new(move |r| {
            r.unwrap();
            // Re-entering the writer from a completion that storage ran inline.
            w2.write(b"c", col2.callback(2)).unwrap();
            w2.write(b"d", col2.callback(3)).unwrap();
        }),
    )
    .unwrap();
    w.write(b"b", col.callback(1)).unwrap();
    let got = col.wait(3);
    assert_eq!(got[0], (1, Ok(tp(0, 2, 1))));
    assert_eq!(got[1], (2, Ok(tp(1, 2, 0))));
    assert_eq!(got[2], (3, Ok(tp(1, 2, 1))));
}

#[test]
fn concurrent_writers_keep_per_thread_order() {
    let sink = MemSink::new();
    let w = Arc::new(writer(&sink, cfg(50, 1 << 20, Duration::from_millis(1))));
    let threads = 8;
    let per = 500;
    let cols: Vec<Collector> = (0..threads).map(|_| Collector::default()).collect();
    thread::scope(|s| {
        for (t, col) in cols.iter().enumerate() {
            let w = Arc::clone(&w);
            s.spawn(move || {
                for i in 0..per {
                    w.write(&rec(t * per + i, 12), col.callback(i)).unwrap();
                }
            });
        }
    });
    for (t, col) in cols.iter().enumerate() {
        let pos = ok_positions(&col.wait(per));
        for pair in pos.windows(2) {
            assert!(
                (pair[0].position, pair[0].batch_index) < (pair[1].position, pair[1].batch_index)
            );
        }
        let recs: Vec<_> = (0..per).map(|i| rec(t * per + i, 12)).collect();
        assert_read_back(&sink, &recs, &pos);
    }
    let s = w.stats();
    assert_eq!(s.records, (threads * per) as u64);
    assert_eq!(
        s.flush_max_records + s.flush_max_delay,
        s.batched_entries,
        "every batch flushed exactly once"
    );
}

#[test]
fn slow_storage_does_not_pile_up_timer_flushes() {
    // Storage takes 4 ms per entry, far beyond max_delay: batches queue
    // behind it, but every batch is written once and nothing is lost.
    let sink = MemSink::slow(Duration::from_millis(4));
    let w = writer(&sink, cfg(1000, 1 << 20, Duration::from_millis(1)));
    let col = Collector::default();
    let n = 300;
    for i in 0..n {
        w.write(&rec(i, 8), col.callback(i)).unwrap();
        if i % 30 == 29 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    let pos = ok_positions(&col.wait(n));
    let s = w.stats();
    assert_eq!(s.flush_max_delay, s.batched_entries);
    assert_eq!(s.records, n as u64);
    assert_eq!(sink.appended().len() as u64, s.entries);
    assert!(sink
        .appended()
        .iter()
        .all(|e| !decode_entry(e).unwrap().is_empty()));
    let recs: Vec<_> = (0..n).map(|i| rec(i, 8)).collect();
    assert_read_back(&sink, &recs, &pos);
}

#[test]
fn metrics_histograms_match_batches() {
    let sink = MemSink::new();
    let w = writer(&sink, cfg(10, 1 << 20, HOUR));
    let col = Collector::default();
    // 3 batches of 10 records of 101 bytes (1034-byte entries), then one of 60.
    let recs: Vec<_> = (0..30).map(|i| rec(i, 101)).collect();
    write_all(&w, &col, &recs);
    w.reconfigure(cfg(60, 1 << 20, HOUR)).unwrap();
    let recs2: Vec<_> = (0..60).map(|i| rec(i, 10)).collect();
    let slot = ManySlot::default();
    w.write_many(&recs2, slot.callback()).unwrap();
    col.wait(30);
    slot.wait().unwrap();
    let s = w.stats();
    assert_eq!(
        s.batch_records.bounds,
        &[10.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
    );
    assert_eq!(s.batch_records.counts, vec![3, 0, 1, 0, 0, 0, 0]);
    assert_eq!(s.batch_records.sum, 90.0);
    let sizes: Vec<u64> = sink.entries().iter().map(|e| e.len() as u64).collect();
    assert_eq!(sizes[0], 4 + 10 * 103);
    assert_eq!(sizes[3], 4 + 60 * 12);
    // 1024 < 1034 <= 2048 for the first three, 512 < 724 <= 1024 for the last.
    assert_eq!(s.batch_size_bytes.counts, vec![0, 0, 1, 3, 0, 0, 0, 0, 0]);
    assert_eq!(s.batch_size_bytes.sum, sizes.iter().sum::<u64>() as f64);
    assert_eq!(s.oldest_record_delay.count, 4);
    assert_eq!(s.bytes, sizes.iter().sum::<u64>());
    assert_eq!(s.flush_max_records, 4);
}

#[test]
fn bad_config_is_rejected_with_key() {
    let sink = MemSink::new();
    for (c, key) in [
        (cfg(0, 10, HOUR), "max_records"),
        (cfg(10, 0, HOUR), "max_size"),
        (cfg(2_000_000, 10, HOUR), "max_records"),
    ] {
        match BufferedWriter::new(sink.as_sink(), c, None) {
            Err(Error::Config { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{other:?}"),
        }
    }
    let w = BufferedWriter::new(sink.as_sink(), WriterConfig::default(), None).unwrap();
    assert_eq!(w.name(), "mem");
}

#[test]
fn drop_closes_and_fails_pending() {
    let sink = MemSink::new();
    let col = Collector::default();
    {
        let w = writer(&sink, cfg(100, 1 << 20, HOUR));
        w.write(b"x", col.callback(0)).unwrap();
    }
    assert!(matches!(col.wait(1)[0].1, Err(Error::WriterClosed(_))));
    assert!(sink.appended().is_empty());
}

/// Panics at its first append, then forwards to a [`MemSink`].
struct PanicOnceSink {
    inner: Arc<MemSink>,
    armed: std::sync::atomic::AtomicBool,
}

impl txnstream_core::sink::EntrySink for PanicOnceSink {
    fn append_async(&self, entry: Vec<u8>, done: txnstream_core::sink::AppendCallback) {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("a bug in the sink");
        }
        self.inner.append_async(entry, done);
    }

    fn name(&self) -> &str {
        "panic-once"
    }
}

#[test]
fn a_panic_in_one_writers_timer_flush_does_not_stop_the_timer_for_the_others() {
    // The max_delay timer is one thread for the whole process: a panic in
    // one writer's delayed flush must not stop every other writer's.
    let bad = Arc::new(PanicOnceSink {
        inner: MemSink::new(),
        armed: std::sync::atomic::AtomicBool::new(true),
    });
    let cfg5 = cfg(1000, 1 << 20, Duration::from_millis(5));
    let a = BufferedWriter::new(bad.clone(), cfg5, Some("a".into())).unwrap();
    let dropped = Collector::default();
    a.write(b"lost", dropped.callback(0)).unwrap();
    // Only the timer flushes it (max_delay): wait for the panic to happen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bad.armed.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the timer never flushed"
        );
        thread::sleep(Duration::from_millis(1));
    }
    let sink = MemSink::new();
    let b = writer(&sink, cfg5);
    let col = Collector::default();
    b.write(b"later", col.callback(0)).unwrap();
    let got = col.wait(1); // fails after 10 s if the timer thread died
    assert!(got[0].1.is_ok());
    assert_eq!(sink.entries().len(), 1);
}
