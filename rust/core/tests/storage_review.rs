//! Review findings in the storage core (stop 24), each a test that failed before its fix:
//!
//! - a compaction a power cut tore before its commit left its ledger id free: the
//!   next ledger took it, and the next replay gave that ledger's acknowledged
//!   entries to the dead compaction (lost silently, or the directory refused);
//! - a blocking storage call from a completion callback (a storage thread)
//!   (a ledger append, a compacted topic's put) waited on itself: every ledger of
//!   the directory hung for good;
//! - a writer config with a huge `max_delay` panicked at its first write;
//! - a panic in one caller's completion callback stopped the whole directory and
//!   reported the other callers' durable writes as failed;
//! - (stop 25) the last handle closed in a completion callback shut the store
//!   down on its own storage thread: it waited on itself, for good;
//! - (stop 25) the process-wide writer timer waited in one full directory's
//!   backpressure, holding up every other directory's due batches.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::ledger::fs::Fs;
use txnstream_core::ledger::simfs::SimFs;
use txnstream_core::ledger::{FaultInjector, FaultKind, LedgerOptions, ManagedLedger};
use txnstream_core::sink::EntrySink;
use txnstream_core::writer::{BufferedWriter, WriterConfig};
use txnstream_core::Position;

const DATA: &str = "/data";

fn sim_opts(fs: &Arc<SimFs>) -> LedgerOptions {
    LedgerOptions {
        fs: Some(Arc::clone(fs) as Arc<dyn Fs>),
        // No background checkpoint during the test.
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes: 1 << 30,
        ..LedgerOptions::default()
    }
}

type Compaction = std::thread::JoinHandle<txnstream_core::Result<Vec<Position>>>;

/// Ledger "c" with one entry (its position) and a compaction of 16 entries
/// written to the journal, held at its sync (release with `inj.clear()`).
fn compaction_held_at_its_sync(
    fs: &Arc<SimFs>,
) -> (Arc<ManagedLedger>, Position, Arc<FaultInjector>, Compaction) {
    let inj = Arc::new(FaultInjector::new());
    let o = LedgerOptions {
        fault_injector: Some(Arc::clone(&inj)),
        storage_threads: 2,
        preallocate_bytes: 0,
        ..sim_opts(fs)
    };
    let ml = ManagedLedger::open(Path::new(DATA), "c", o).unwrap();
    let first = ml.append(b"before").unwrap();
    inj.hold(FaultKind::Sync);
    let m2 = Arc::clone(&ml);
    let t = std::thread::spawn(move || {
        let entries: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i + 1; 700]).collect();
        m2.replace_all(entries)
    });
    assert!(inj.wait_held(FaultKind::Sync, Duration::from_secs(10)));
    (ml, first, inj, t)
}

#[test]
fn a_compaction_cut_before_its_commit_never_takes_the_next_ledgers_entries() {
    use txnstream_core::ledger::journal::{decode_head, segment_path, Kind, SEGMENT_HEADER_LEN};
    let fs = Arc::new(SimFs::new());
    let (ml, first, inj, t) = compaction_held_at_its_sync(&fs);
    let seg = segment_path(Path::new(DATA), 0);
    let live = fs.file_bytes(&seg).unwrap();
    // Find the ReplaceBegin record.
    let mut off = SEGMENT_HEADER_LEN as usize;
    let mut rb_end = None;
    while off + 48 <= live.len() {
        let h = decode_head(&live[off..]).unwrap();
        let next = off + 48 + h.body_len as usize;
        if h.kind == Kind::ReplaceBegin {
            rb_end = Some(next);
            break;
        }
        off = next;
    }
    let rb_end = rb_end.unwrap();
    let keep = rb_end.div_ceil(512) * 512; // whole sectors landed
    let image = Arc::new(fs.power_cut(1));
    let mut bytes = image.file_bytes(&seg).unwrap();
    bytes.resize(live.len(), 0);
    bytes[..keep].copy_from_slice(&live[..keep]);
    for b in &mut bytes[keep..] {
        *b = 0;
    }
    image.put_file(&seg, &bytes).unwrap();
    inj.clear();
    let _ = t.join().unwrap();
    let _ = ml.close();
    drop(ml);

    let r = ManagedLedger::open(Path::new(DATA), "c", sim_opts(&image)).unwrap();
    println!("after recovery 1: ledgers {:?}", r.ledgers());
    assert_eq!(r.read(first).unwrap(), b"before");
    let acked: Vec<Position> = (0..3u8)
        .map(|i| r.append(&[0xA0 + i; 5]).unwrap())
        .collect();
    println!("acknowledged: {acked:?}");
    // Power cut #2 (all acknowledged data is synced).
    let image2 = Arc::new(image.power_cut(2));
    let close1 = r.close();
    println!("close after recovery: {close1:?}");
    drop(r);
    let r2 = ManagedLedger::open(Path::new(DATA), "c", sim_opts(&image2)).unwrap();
    println!(
        "after recovery 2: ledgers {:?}, entry_count {}",
        r2.ledgers(),
        r2.entry_count()
    );
    for p in &acked {
        println!("read {p}: {:?}", r2.read(*p));
    }
    for p in &acked {
        assert!(r2.read(*p).is_ok(), "acknowledged {p} lost");
    }
}

/// R5: a checkpoint whose snapshot falls between a cursor deletion's
/// journal record becoming durable and the cursor's removal from memory
/// writes a CATALOG (checkpoint past the deletion) that still lists the
/// cursor: after a crash the deleted cursor is back (and holds trimming).

#[test]
fn power_cuts_during_a_compaction_lose_no_acknowledged_entry() {
    let mut bad = 0;
    let mut tried = 0;
    for seed in 0..30u64 {
        let fs = Arc::new(SimFs::new());
        let (ml, _, inj, t) = compaction_held_at_its_sync(&fs);
        // Power cut while the compaction group is written but not synced.
        let image = Arc::new(fs.power_cut(seed));
        inj.clear();
        let _ = t.join().unwrap();
        let _ = ml.close();
        drop(ml);

        // Recovery 1: the torn compaction is cut; append new entries.
        let o1 = sim_opts(&image);
        let r = match ManagedLedger::open(Path::new(DATA), "c", o1.clone()) {
            Ok(r) => r,
            Err(e) => panic!("seed {seed}: first recovery failed: {e}"),
        };
        let acked: Vec<(Position, Vec<u8>)> = (0..3u8)
            .map(|i| {
                let d = vec![0xA0 + i; 5];
                (r.append(&d).unwrap(), d)
            })
            .collect();
        // Power cut #2: everything acknowledged is synced.
        let image2 = Arc::new(image.power_cut(seed ^ 0xdead));
        let close1 = r.close();
        drop(r);
        tried += 1;
        let o2 = sim_opts(&image2);
        match ManagedLedger::open(Path::new(DATA), "c", o2) {
            Err(e) => {
                bad += 1;
                println!(
                    "seed {seed}: acked {:?}; close after recovery: {close1:?}; reopen FAILED: {e}",
                    acked.iter().map(|a| a.0).collect::<Vec<_>>()
                );
            }
            Ok(r2) => {
                let mut lost = Vec::new();
                for (p, d) in &acked {
                    match r2.read(*p) {
                        Ok(got) if &got == d => {}
                        other => lost.push((*p, format!("{other:?}"))),
                    }
                }
                if !lost.is_empty() {
                    bad += 1;
                    println!("seed {seed}: close after recovery: {close1:?}; ledgers {:?}; LOST acked entries {lost:?}",
                        r2.ledgers());
                }
                let _ = r2.close();
            }
        }
    }
    println!("{bad} of {tried} images lost or refused acknowledged entries");
    assert_eq!(bad, 0);
}

#[test]
fn a_blocking_call_from_a_completion_callback_fails_at_once_and_the_directory_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(dir.path(), "cb", LedgerOptions::default()).unwrap();
    let m2 = Arc::clone(&ml);
    let (tx, rx) = std::sync::mpsc::channel();
    ml.append_many_async(
        vec![b"first".to_vec()],
        Box::new(move |r| {
            assert!(r.is_ok());
            let _ = tx.send(m2.append(b"from callback").map_err(|e| e.to_string()));
        }),
    );
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the callback's append hung");
    let err = got.expect_err("a blocking append on a storage thread");
    assert!(err.contains("completion callback"), "{err}");
    // The directory goes on: other ledgers open and write.
    let other = ManagedLedger::open(dir.path(), "other", LedgerOptions::default()).unwrap();
    other.append(b"x").unwrap();
    ml.append(b"after").unwrap();
    other.close().unwrap();
    ml.close().unwrap();
}

#[test]
fn a_writer_delay_beyond_a_day_is_refused_not_a_panic_at_the_first_write() {
    let dir = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(dir.path(), "w", LedgerOptions::default()).unwrap();
    for max_delay in [Duration::MAX, Duration::from_secs(86_401)] {
        let cfg = WriterConfig {
            max_delay,
            ..WriterConfig::default()
        };
        let w = BufferedWriter::new(Arc::clone(&ml) as Arc<dyn EntrySink>, cfg, None);
        let Err(err) = w else {
            panic!("max_delay {max_delay:?} accepted");
        };
        assert!(err.to_string().contains("max_delay_ms"), "{err}");
    }
    ml.close().unwrap();
}

#[test]
fn a_panicking_completion_callback_does_not_stop_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = ManagedLedger::open(dir.path(), "a", LedgerOptions::default()).unwrap();
    let b = ManagedLedger::open(dir.path(), "b", LedgerOptions::default()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    a.append_many_async(vec![b"x".to_vec()], Box::new(|_| panic!("a caller's bug")));
    b.append_many_async(
        vec![b"y".to_vec()],
        Box::new(move |r| {
            let _ = tx.send(r.map_err(|e| e.to_string()));
        }),
    );
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("b's write answered");
    assert!(got.is_ok(), "b's durable write reported failed: {got:?}");
    // Later writes of every ledger go on.
    let z = b.append(b"z").unwrap();
    assert_eq!(b.read(z).unwrap(), b"z");
    a.append(b"after").unwrap();
    a.close().unwrap();
    b.close().unwrap();
}

#[test]
fn a_blocking_put_from_a_compacted_topics_callback_fails_at_once() {
    use txnstream_core::ledger::CompactedTopic;
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(CompactedTopic::open(dir.path(), "ns/kv", LedgerOptions::default()).unwrap());
    let t2 = Arc::clone(&t);
    let (tx, rx) = std::sync::mpsc::channel();
    assert!(t.put_many_async(
        vec![("a".to_owned(), Some(b"1".to_vec()))],
        None,
        Box::new(move |r| {
            assert!(r.is_ok());
            let one = t2.put("b", Some(b"2")).map_err(|e| e.to_string());
            let many = t2
                .put_many(vec![("c".to_owned(), None)])
                .map_err(|e| e.to_string());
            let _ = tx.send((one, many));
        }),
    ));
    let (one, many) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the callback's put hung");
    for got in [one.map(|_| ()), many.map(|_| ())] {
        let err = got.expect_err("a blocking put on a storage thread");
        assert!(err.contains("completion callback"), "{err}");
    }
    t.put("b", Some(b"2")).unwrap(); // the topic goes on
    assert_eq!(t.get("a").unwrap().as_deref(), Some(&b"1"[..]));
}

#[test]
fn the_last_handle_dropped_in_a_completion_callback_closes_the_directory_without_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let inj = Arc::new(FaultInjector::new());
    let o = LedgerOptions {
        fault_injector: Some(Arc::clone(&inj)),
        ..LedgerOptions::default()
    };
    let ml = ManagedLedger::open(dir.path(), "last", o).unwrap();
    let cursor = ml.open_cursor("sub").unwrap();
    let first = ml.append(b"first").unwrap();
    cursor.mark_delete(first).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let held = Arc::clone(&ml);
    // The write completes only once this thread has let go of every other
    // handle: the callback owns the only one, so the store closes on the
    // storage thread.
    inj.hold(FaultKind::Sync);
    ml.append_many_async(
        vec![b"second".to_vec()],
        Box::new(move |r| {
            let handles = Arc::strong_count(&held);
            drop(held);
            let _ = tx.send((handles, r.map_err(|e| e.to_string())));
        }),
    );
    drop(ml);
    inj.clear();
    let (handles, got) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the callback never ran");
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(handles, 1, "the callback's handle was not the last");
    // The directory is released: it opens again (waiting for the close to
    // finish), with both entries and the cursor's mark-delete.
    let (otx, orx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = otx.send(ManagedLedger::open(&path, "last", LedgerOptions::default()));
    });
    let again = orx
        .recv_timeout(Duration::from_secs(10))
        .expect("the directory's close hung: reopening waited for it")
        .unwrap();
    let c = again.open_cursor("sub").unwrap();
    assert_eq!(c.mark_delete_position(), Some(first));
    assert_eq!(again.entry_count(), 2);
    again.close().unwrap();
}

#[test]
fn one_directorys_backpressure_does_not_hold_other_directories_batches() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let inj = Arc::new(FaultInjector::new());
    let full = LedgerOptions {
        fault_injector: Some(Arc::clone(&inj)),
        max_pending_bytes: 1 << 20,
        append_timeout: Duration::from_secs(60),
        ..LedgerOptions::default()
    };
    let a = ManagedLedger::open(dir_a.path(), "a", full).unwrap();
    // Released however the test ends (a failed assert would otherwise hang
    // in A's close, waiting for its held sync).
    struct Release(Arc<FaultInjector>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.clear();
        }
    }
    let _release = Release(Arc::clone(&inj));
    // Directory A's journal is stuck at a sync with 2 MiB queued: no room.
    inj.hold(FaultKind::Sync);
    a.append_many_async(vec![vec![7u8; 2 << 20]], Box::new(|_| {}));
    assert!(inj.wait_held(FaultKind::Sync, Duration::from_secs(10)));
    let cfg = WriterConfig {
        max_delay: Duration::from_millis(1),
        ..WriterConfig::default()
    };
    let wa = BufferedWriter::new(Arc::clone(&a) as Arc<dyn EntrySink>, cfg, None).unwrap();
    let (atx, arx) = std::sync::mpsc::channel();
    wa.write(
        b"a",
        Box::new(move |r| {
            let _ = atx.send(r.is_ok());
        }),
    )
    .unwrap();
    // A's batch is due: the process-wide timer thread reaches it first.
    std::thread::sleep(Duration::from_millis(50));
    let b = ManagedLedger::open(dir_b.path(), "b", LedgerOptions::default()).unwrap();
    let wb = BufferedWriter::new(Arc::clone(&b) as Arc<dyn EntrySink>, cfg, None).unwrap();
    let (btx, brx) = std::sync::mpsc::channel();
    wb.write(
        b"b",
        Box::new(move |r| {
            let _ = btx.send(r.is_ok());
        }),
    )
    .unwrap();
    let b_written = brx
        .recv_timeout(Duration::from_secs(10))
        .expect("B's batch waited behind directory A's backpressure");
    assert!(b_written);
    assert!(
        arx.try_recv().is_err(),
        "A's record written while A was full"
    );
    // Not submitted either (A's held sync alone would keep it from completing).
    assert_eq!(
        wa.stats().flush_max_delay,
        0,
        "A's batch submitted while A was full"
    );
    // Once A has room again, its batch is written too.
    inj.clear();
    assert!(arx
        .recv_timeout(Duration::from_secs(10))
        .expect("A's batch never written once A had room"));
    wa.close();
    wb.close();
    a.close().unwrap();
    b.close().unwrap();
}
