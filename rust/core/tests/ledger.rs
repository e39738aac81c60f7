//! Managed ledger: durability, recovery, cursors, trimming, compaction, faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::ledger::catalog::ledger_prefix;
use txnstream_core::ledger::journal;
use txnstream_core::ledger::ledger_file::log_path;
use txnstream_core::ledger::{
    CompactedTopic, FaultKind, LedgerOptions, ManagedLedger, HOLD_CURSOR_PREFIX, MAX_ENTRY_SIZE,
};
use txnstream_core::sink::EntrySink;
use txnstream_core::{Error, Position, TxnPosition};

fn opts() -> LedgerOptions {
    LedgerOptions {
        preallocate_bytes: 1 << 20,
        // Tests that damage journal records need them still in use.
        checkpoint_interval: Duration::from_secs(3600),
        ..LedgerOptions::default()
    }
}

fn payload(i: u64) -> Vec<u8> {
    let n = (i * 37 % 300) as usize;
    (0..n).map(|k| (i as usize * 131 + k) as u8).collect()
}

mod support;

/// A crash image of a live data directory (see `support`); returns the
/// copy's file prefix of managed ledger `name`.
fn crash_image(src_data: &Path, dst_data: &Path, name: &str) -> PathBuf {
    support::copy_data_dir(src_data, dst_data);
    ledger_prefix(dst_data, name).unwrap()
}

/// The newest ledger data file of the managed ledger with file prefix
/// `prefix`.
fn last_log(prefix: &Path) -> PathBuf {
    let dir = prefix.parent().unwrap();
    let stem = prefix.file_name().unwrap().to_str().unwrap().to_owned();
    let mut ids: Vec<u64> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            let (ml, id) = n.strip_suffix(".log")?.rsplit_once('@')?;
            (ml == stem).then(|| id.parse().ok()).flatten()
        })
        .collect();
    ids.sort();
    log_path(prefix, *ids.last().unwrap())
}

fn flip_byte(path: &Path, off: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, off).unwrap();
}

#[test]
fn append_read_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "public/default/t", opts()).unwrap();
    assert_eq!(ml.last_position(), None);
    let mut pos = Vec::new();
    for i in 0..100 {
        pos.push(ml.append(&payload(i)).unwrap());
    }
    let many = ml.append_many((100..110).map(payload).collect()).unwrap();
    pos.extend(many);
    for w in pos.windows(2) {
        assert!(w[0] < w[1]);
    }
    for (i, p) in pos.iter().enumerate() {
        assert_eq!(ml.read(*p).unwrap(), payload(i as u64));
    }
    ml.close().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "public/default/t", opts()).unwrap();
    let all = ml
        .read_range(pos[0], Position::new(u64::MAX, u64::MAX))
        .unwrap();
    assert_eq!(all.len(), 110);
    for (i, (p, d)) in all.iter().enumerate() {
        assert_eq!(*p, pos[i]);
        assert_eq!(*d, payload(i as u64));
    }
    // New appends go after everything recovered.
    let p = ml.append(b"more").unwrap();
    assert!(p > pos[109]);
    assert!(tmp.path().join("CATALOG").is_file());
}

#[test]
fn rollover_by_entries_and_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 10,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "roll", o).unwrap();
    let pos: Vec<Position> = (0..35).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let ledgers = ml.ledgers();
    assert_eq!(ledgers.len(), 4);
    assert_eq!(
        ledgers.iter().map(|l| l.1).collect::<Vec<_>>(),
        vec![10, 10, 10, 5]
    );
    assert_eq!(pos[10], Position::new(ledgers[1].0, 0));
    let got = ml.read_range(pos[5], pos[25]).unwrap();
    assert_eq!(got.len(), 21);
    ml.close().unwrap();

    let o = LedgerOptions {
        max_bytes_per_ledger: 4096,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "bytes", o).unwrap();
    for _ in 0..20 {
        ml.append(&[7u8; 1000]).unwrap();
    }
    // 4 records of 1008 bytes fit in 4096.
    assert!(ml.ledgers().iter().all(|l| l.1 <= 4));
    assert_eq!(ml.ledgers().len(), 5);
}

#[test]
fn concurrent_appenders_share_syncs() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "conc", opts()).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let ml = Arc::clone(&ml);
            std::thread::spawn(move || {
                (0..200u64)
                    .map(|i| {
                        let d = payload(t * 1000 + i);
                        (ml.append(&d).unwrap(), d)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<(Position, Vec<u8>)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    all.dedup_by_key(|x| x.0);
    assert_eq!(all.len(), 1600);
    for (p, d) in all {
        assert_eq!(ml.read(p).unwrap(), d);
    }
}

#[test]
fn async_callbacks_run_in_order_after_durability() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "async", opts()).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..500u64 {
        let tx = tx.clone();
        ml.append_async(
            payload(i),
            Box::new(move |r| {
                tx.send((i, r)).unwrap();
            }),
        );
    }
    let mut last = None;
    for want in 0..500u64 {
        let (i, r) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(i, want);
        let p = r.unwrap();
        assert!(Some(p) > last);
        last = Some(p);
    }
    ml.close().unwrap();
    // After close, callbacks fail at once with LedgerClosed.
    let (tx, rx) = mpsc::channel();
    ml.append_async(b"x".to_vec(), Box::new(move |r| tx.send(r).unwrap()));
    assert!(matches!(rx.recv().unwrap(), Err(Error::LedgerClosed(_))));
}

#[test]
fn bad_arguments_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "bad", opts()).unwrap();
    assert!(matches!(
        ml.read(Position::new(1, 0)),
        Err(Error::PositionNotFound { .. })
    ));
    let p = ml.append(b"a").unwrap();
    assert!(matches!(
        ml.read(Position::new(p.ledger_id, 1)),
        Err(Error::PositionNotFound { .. })
    ));
    assert!(matches!(
        ml.read(Position::new(p.ledger_id + 5, 0)),
        Err(Error::PositionNotFound { .. })
    ));
    assert!(matches!(
        ml.read_range(Position::new(9, 9), Position::new(1, 1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ml.read_range(Position::new(p.ledger_id, 1), Position::new(p.ledger_id, 5)),
        Err(Error::PositionNotFound { .. })
    ));
    let big = vec![0u8; MAX_ENTRY_SIZE + 1];
    assert!(matches!(ml.append(&big), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        ManagedLedger::open(tmp.path(), "", opts()),
        Err(Error::InvalidArgument(_))
    ));
    let bad = LedgerOptions {
        max_entries_per_ledger: 0,
        ..opts()
    };
    assert!(matches!(
        ManagedLedger::open(tmp.path(), "x", bad),
        Err(Error::Config { .. })
    ));
    // A second writer on the same ledger is refused.
    assert!(matches!(
        ManagedLedger::open(tmp.path(), "bad", opts()),
        Err(Error::Io { .. })
    ));
    let cur = ml.open_cursor("c").unwrap();
    assert!(matches!(
        cur.mark_delete(Position::new(p.ledger_id, 3)),
        Err(Error::PositionNotFound { .. })
    ));
    assert!(matches!(
        cur.delete_batch_indexes(&[TxnPosition {
            position: p,
            batch_size: 4,
            batch_index: 4
        }]),
        Err(Error::InvalidArgument(_))
    ));
    ml.close().unwrap();
    assert!(matches!(ml.append(b"x"), Err(Error::LedgerClosed(_))));
    assert!(matches!(ml.read(p), Err(Error::LedgerClosed(_))));
    assert!(matches!(cur.read_next(1), Err(Error::LedgerClosed(_))));
    assert!(matches!(cur.mark_delete(p), Err(Error::LedgerClosed(_))));
    ml.close().unwrap();
}

#[test]
fn torn_tail_is_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let ml = ManagedLedger::open(&live, "t", opts()).unwrap();
    let pos: Vec<Position> = (0..20)
        .map(|i| ml.append(&payload(i + 1)).unwrap())
        .collect();
    for (k, cut) in [(0u64, 3usize), (1, 9), (2, 40)] {
        let img = tmp.path().join(format!("img{k}"));
        crash_image(&live, &img, "t");
        // A partial record after the last acknowledged one.
        let (journal_file, end) = support::journal_end(&img);
        let mut rec = Vec::new();
        let body = vec![0xAB; 60];
        journal::encode_head(
            &mut rec,
            journal::Kind::Entry,
            0,
            1,
            pos[19].ledger_id,
            20,
            &body,
        );
        rec.extend_from_slice(&body);
        let f = OpenOptions::new().write(true).open(&journal_file).unwrap();
        f.write_all_at(&rec[..cut], end).unwrap();
        drop(f);
        let ml2 = ManagedLedger::open(&img, "t", opts()).unwrap();
        assert_eq!(ml2.last_position(), Some(pos[19]));
        for (i, p) in pos.iter().enumerate() {
            assert_eq!(ml2.read(*p).unwrap(), payload(i as u64 + 1));
        }
        ml2.close().unwrap();
        // It reopens clean, without the torn bytes.
        let ml3 = ManagedLedger::open(&img, "t", opts()).unwrap();
        assert_eq!(ml3.entry_count(), 20);
    }
}

use support::entry_record;

#[test]
fn bit_flips_tail_truncated_middle_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let ml = ManagedLedger::open(&live, "b", opts()).unwrap();
    let pos: Vec<Position> = (0..10)
        .map(|i| ml.append(&payload(i + 5)).unwrap())
        .collect();
    let body = |i: usize| journal::RECORD_HEADER_LEN as u64 + payload(i as u64 + 5).len() as u64;

    // Bit rot in the last acknowledged record: the synced hint says it was
    // acknowledged, so it is corruption (read-write and read-only agree).
    let img = tmp.path().join("last");
    crash_image(&live, &img, "b");
    let (path, off) = entry_record(&img, pos[9]);
    flip_byte(&path, off + body(9) - 1);
    for read_only in [false, true] {
        match ManagedLedger::open(
            &img,
            "b",
            LedgerOptions {
                read_only,
                ..opts()
            },
        ) {
            Err(Error::CorruptLedger {
                position, offset, ..
            }) => {
                assert_eq!(position, pos[9]);
                assert_eq!(offset, off);
            }
            other => panic!("read_only={read_only}: expected CorruptLedger, got {other:?}"),
        }
    }
    // The same damage with the hint lost too (a power cut before it was
    // written back): nothing says it was acknowledged, a torn tail, cut.
    fs::remove_file(img.join("journal/SYNCED")).unwrap();
    let ml2 = ManagedLedger::open(&img, "b", opts()).unwrap();
    assert_eq!(ml2.last_position(), Some(pos[8]));
    drop(ml2);

    // Damage in the middle: later records carry an acknowledged point past
    // it, so it is corruption, reported with where it is, and nothing is cut.
    for (name, k, delta) in [("mid-payload", 3usize, body(3) - 2), ("mid-header", 4, 1)] {
        let img = tmp.path().join(name);
        crash_image(&live, &img, "b");
        fs::remove_file(img.join("journal/SYNCED")).unwrap();
        let (path, off) = entry_record(&img, pos[k]);
        flip_byte(&path, off + delta);
        let size = fs::metadata(&path).unwrap().len();
        match ManagedLedger::open(&img, "b", opts()) {
            Err(Error::CorruptLedger {
                position, offset, ..
            }) => {
                assert_eq!(offset, off, "{name}");
                if name == "mid-payload" {
                    // The record's header is intact: it names the entry.
                    assert_eq!(position, pos[3], "{name}");
                }
            }
            other => panic!("{name}: expected CorruptLedger, got {other:?}"),
        }
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            size,
            "{name}: nothing cut"
        );
        let r = ManagedLedger::open(
            &img,
            "b",
            LedgerOptions {
                read_only: true,
                ..opts()
            },
        );
        assert!(
            matches!(r, Err(Error::CorruptLedger { .. })),
            "{name}: {r:?}"
        );
    }

    // A sealed ledger file is trusted at open and verified on read.
    ml.close().unwrap();
    let prefix = ledger_prefix(&live, "b").unwrap();
    flip_byte(&last_log(&prefix), end_of_closed(&live, 9) - 1);
    let ml = ManagedLedger::open(&live, "b", opts()).unwrap();
    assert_eq!(ml.read(pos[8]).unwrap(), payload(13));
    match ml.read(pos[9]) {
        Err(Error::CorruptLedger { position, .. }) => assert_eq!(position, pos[9]),
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
}

fn end_of_closed(data: &Path, i: u64) -> u64 {
    let mut end = 32;
    for k in 0..=i {
        end += 8 + payload(k + 5).len() as u64;
    }
    let _ = data;
    end
}

#[test]
fn cursor_state_survives_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "c", opts()).unwrap();
    let pos: Vec<Position> = (0..10).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let cur = ml.open_cursor("sub").unwrap();
    assert_eq!(cur.mark_delete_position(), None);
    let first = cur.read_next(3).unwrap();
    assert_eq!(
        first.iter().map(|x| x.0).collect::<Vec<_>>(),
        pos[..3].to_vec()
    );
    cur.mark_delete(pos[1]).unwrap();
    cur.delete(&[pos[4], pos[5]]).unwrap();
    let tp = |i: usize, n: u32, k: u32| TxnPosition {
        position: pos[i],
        batch_size: n,
        batch_index: k,
    };
    cur.delete_batch_indexes(&[tp(7, 4, 0), tp(7, 4, 2)])
        .unwrap();
    assert_eq!(cur.batch_ack_set(pos[7]).unwrap().to_words(), vec![0b1010]);
    // Deleting 3 lets the mark-delete run over 2? no: 2 is not deleted.
    cur.delete(&[pos[3]]).unwrap();
    assert_eq!(cur.mark_delete_position(), Some(pos[1]));
    cur.delete(&[pos[2]]).unwrap();
    assert_eq!(cur.mark_delete_position(), Some(pos[5]));
    assert!(cur.is_deleted(pos[4]));
    assert!(!cur.is_deleted(pos[6]));
    cur.rewind();
    let next = cur.read_next(10).unwrap();
    assert_eq!(
        next.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![pos[6], pos[7], pos[8], pos[9]]
    );
    cur.delete(&[pos[8]]).unwrap();
    // Wrong batch size for a partially deleted entry is refused, atomically.
    assert!(cur
        .delete_batch_indexes(&[tp(9, 2, 0), tp(7, 5, 1)])
        .is_err());
    assert!(cur.batch_ack_set(pos[9]).is_none());
    ml.close().unwrap();

    let ml = ManagedLedger::open(tmp.path(), "c", opts()).unwrap();
    assert_eq!(ml.cursor_names(), vec!["sub".to_owned()]);
    let cur = ml.open_cursor("sub").unwrap();
    assert_eq!(cur.mark_delete_position(), Some(pos[5]));
    assert!(cur.is_deleted(pos[8]));
    assert!(!cur.is_deleted(pos[9]));
    assert_eq!(cur.batch_ack_set(pos[7]).unwrap().to_words(), vec![0b1010]);
    // Finishing the batch deletes the entry; mark-delete moves over 7 and 8.
    cur.delete_batch_indexes(&[tp(7, 4, 1), tp(7, 4, 3)])
        .unwrap();
    assert!(cur.batch_ack_set(pos[7]).is_none());
    assert!(cur.is_deleted(pos[7]));
    assert_eq!(cur.mark_delete_position(), Some(pos[5]));
    cur.delete(&[pos[6]]).unwrap();
    assert_eq!(cur.mark_delete_position(), Some(pos[8]));
    let got = cur.read_next(10).unwrap();
    assert_eq!(got.iter().map(|x| x.0).collect::<Vec<_>>(), vec![pos[9]]);
    cur.flush().unwrap();
    // A crash after flush keeps the flushed state.
    let img = tmp.path().join("img");
    crash_image(tmp.path(), &img, "c");
    let ml2 = ManagedLedger::open(&img, "c", opts()).unwrap();
    assert_eq!(
        ml2.open_cursor("sub").unwrap().mark_delete_position(),
        Some(pos[8])
    );
}

#[test]
fn background_flush_persists_cursor() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        cursor_flush_interval: Duration::from_millis(20),
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "bg", o).unwrap();
    let pos: Vec<Position> = (0..5).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let cur = ml.open_cursor("s").unwrap();
    cur.mark_delete(pos[2]).unwrap();
    // No explicit flush: the background flush writes META.
    let ro = LedgerOptions {
        read_only: true,
        ..opts()
    };
    let mut seen = None;
    for _ in 0..200 {
        let r = ManagedLedger::open(tmp.path(), "bg", ro.clone()).unwrap();
        seen = r.open_cursor("s").unwrap().mark_delete_position();
        if seen.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(seen, Some(pos[2]));
}

#[test]
fn ledgers_before_every_cursor_are_trimmed() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 5,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "trim", o.clone()).unwrap();
    let pos: Vec<Position> = (0..23).map(|i| ml.append(&payload(i)).unwrap()).collect();
    assert_eq!(ml.ledgers().len(), 5);
    // Without cursors nothing is trimmed.
    ml.flush().unwrap();
    assert_eq!(ml.ledgers().len(), 5);
    let a = ml.open_cursor("a").unwrap();
    let b = ml.open_cursor("b").unwrap();
    a.mark_delete(pos[17]).unwrap();
    b.mark_delete(pos[9]).unwrap();
    ml.flush().unwrap();
    // Ledgers of entries 0-4 and 5-9 are wholly before both cursors.
    assert_eq!(ml.ledgers().len(), 3);
    assert_eq!(ml.first_position(), Some(pos[10]));
    assert!(matches!(
        ml.read(pos[3]),
        Err(Error::PositionNotFound { .. })
    ));
    let prefix = ledger_prefix(tmp.path(), "trim").unwrap();
    assert!(!log_path(&prefix, pos[0].ledger_id).exists());
    // Deleting a trimmed position is a no-op, not an error.
    b.delete(&[pos[2]]).unwrap();
    b.mark_delete(pos[22]).unwrap();
    ml.flush().unwrap();
    // a (at 17) still holds the ledger of 15-19.
    assert_eq!(ml.first_position(), Some(pos[15]));
    a.mark_delete(pos[21]).unwrap();
    ml.flush().unwrap();
    // The newest ledger always stays.
    assert_eq!(ml.first_position(), Some(pos[20]));
    ml.close().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "trim", o).unwrap();
    assert_eq!(ml.first_position(), Some(pos[20]));
    assert_eq!(ml.last_position(), Some(pos[22]));
    let c = ml.open_cursor("new").unwrap();
    assert_eq!(c.read_next(1).unwrap()[0].0, pos[20]);
}

#[test]
fn hold_cursors_keep_ledgers_but_never_trim_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 5,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "hold", o.clone()).unwrap();
    let pos: Vec<Position> = (0..23).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let hold = ml
        .open_cursor(&format!("{HOLD_CURSOR_PREFIX}snapshot"))
        .unwrap();
    hold.mark_delete(pos[7]).unwrap();
    ml.flush().unwrap();
    // Only a hold: nothing goes, as without cursors.
    assert_eq!(ml.first_position(), Some(pos[0]));
    // A subscription past the hold: the hold decides.
    let sub = ml.open_cursor("sub").unwrap();
    sub.mark_delete(pos[21]).unwrap();
    ml.flush().unwrap();
    assert_eq!(ml.first_position(), Some(pos[5]));
    // The hold moves: now the subscription's position and the newest ledger decide.
    hold.mark_delete(pos[22]).unwrap();
    ml.flush().unwrap();
    assert_eq!(ml.first_position(), Some(pos[20]));
    ml.close().unwrap();
    // The rule holds for persisted (not opened) cursors too.
    let ml = ManagedLedger::open(tmp.path(), "hold", o).unwrap();
    assert_eq!(ml.first_position(), Some(pos[20]));
    ml.delete_cursor("sub").unwrap();
    let more: Vec<Position> = (0..10).map(|i| ml.append(&payload(i)).unwrap()).collect();
    ml.flush().unwrap();
    assert_eq!(ml.first_position(), Some(pos[20]));
    assert_eq!(ml.last_position(), more.last().copied());
}

#[test]
fn deleting_the_slowest_cursor_lets_the_flusher_trim_without_other_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 5,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "del", o).unwrap();
    let pos: Vec<Position> = (0..12).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let fast = ml.open_cursor("fast").unwrap();
    let slow = ml.open_cursor("slow").unwrap();
    fast.mark_delete(pos[11]).unwrap();
    slow.mark_delete(pos[1]).unwrap();
    ml.flush().unwrap();
    assert_eq!(ml.first_position(), Some(pos[0]));
    ml.delete_cursor("slow").unwrap();
    // No cursor moves from here: the background flusher must still trim.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ml.first_position() != Some(pos[10]) {
        assert!(std::time::Instant::now() < deadline, "never trimmed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn compacted_topic_keeps_newest_per_key() {
    let tmp = tempfile::tempdir().unwrap();
    let t = CompactedTopic::open(tmp.path(), "ns/__snapshots", opts()).unwrap();
    for round in 0..5u8 {
        for k in 0..20 {
            t.put(&format!("k{k:02}"), Some(&[round, k])).unwrap();
        }
    }
    t.put("k03", None).unwrap();
    t.put_many(vec![
        ("k04".into(), None),
        ("k05".into(), Some(b"five".to_vec())),
    ])
    .unwrap();
    assert_eq!(t.get("k03").unwrap(), None);
    assert_eq!(t.get("k05").unwrap(), Some(b"five".to_vec()));
    assert_eq!(t.get("k06").unwrap(), Some(vec![4, 6]));
    assert_eq!(t.len().unwrap(), 18);
    let before = t.items().unwrap();
    let stats = t.compact().unwrap();
    assert_eq!(stats.entries_before, 103);
    assert_eq!(stats.entries_after, 18);
    assert_eq!(t.items().unwrap(), before);
    assert_eq!(t.ledger().ledgers().len(), 1);
    t.put("k03", Some(b"back")).unwrap();
    t.close().unwrap();
    let t = CompactedTopic::open(tmp.path(), "ns/__snapshots", opts()).unwrap();
    assert_eq!(t.len().unwrap(), 19);
    assert_eq!(t.get("k03").unwrap(), Some(b"back".to_vec()));
    assert_eq!(t.get("k06").unwrap(), Some(vec![4, 6]));
    assert!(t.ledger().is_compacted());
}

#[test]
fn write_only_compacted_topic_reads_nothing_at_open_and_compacts_from_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let t = CompactedTopic::open_write_only(tmp.path(), "ns/__snap", opts()).unwrap();
    assert!(t.is_write_only());
    for round in 0..4u8 {
        for k in 0..10u8 {
            t.put(&format!("k{k}"), Some(&[round, k])).unwrap();
        }
    }
    t.put("k1", None).unwrap();
    // No index: reads are refused, not answered "no such key".
    for err in [
        t.get("k2").map(|_| ()),
        t.items().map(|_| ()),
        t.len().map(|_| ()),
        t.is_empty().map(|_| ()),
    ] {
        let msg = err.unwrap_err().to_string();
        assert!(
            msg.contains("write_only") && msg.contains("ns/__snap"),
            "{msg}"
        );
    }
    t.close().unwrap();
    // Reopening reads nothing (no key index is built).
    let t = CompactedTopic::open_write_only(tmp.path(), "ns/__snap", opts()).unwrap();
    assert_eq!(t.ledger().entry_count(), 41);
    t.put("k2", Some(b"two")).unwrap();
    let stats = t.compact().unwrap();
    assert_eq!(stats.entries_before, 42);
    assert_eq!(stats.entries_after, 9);
    t.close().unwrap();
    let r = CompactedTopic::open(tmp.path(), "ns/__snap", opts()).unwrap();
    assert_eq!(r.len().unwrap(), 9);
    assert_eq!(r.get("k1").unwrap(), None);
    assert_eq!(r.get("k2").unwrap(), Some(b"two".to_vec()));
    assert_eq!(r.get("k9").unwrap(), Some(vec![3, 9]));
    r.close().unwrap();
    let ro = LedgerOptions {
        read_only: true,
        ..opts()
    };
    assert!(CompactedTopic::open_write_only(tmp.path(), "ns/__snap", ro).is_err());
}

#[test]
fn injected_faults_fail_waiters_and_leave_log_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "f", opts()).unwrap();
    let good: Vec<Position> = (0..5).map(|i| ml.append(&payload(i)).unwrap()).collect();
    for kind in [FaultKind::Sync, FaultKind::Write] {
        ml.inject_fault(kind, libc::ENOSPC, 1);
        let err = ml
            .append_many((100..110).map(payload).collect())
            .unwrap_err();
        match err {
            Error::Io { errno, .. } => assert_eq!(errno, Some(libc::ENOSPC)),
            other => panic!("{other:?}"),
        }
        assert_eq!(ml.last_position(), Some(good[good.len() - 1]));
    }
    // Concurrent waiters all fail with the same error.
    ml.inject_fault(FaultKind::Sync, libc::EIO, 1);
    let (tx, rx) = mpsc::channel();
    for i in 0..50u64 {
        let tx = tx.clone();
        ml.append_async(payload(i), Box::new(move |r| tx.send(r).unwrap()));
    }
    let results: Vec<_> = (0..50).map(|_| rx.recv().unwrap()).collect();
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(failed >= 1);
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(
                e,
                Error::Io {
                    errno: Some(libc::EIO),
                    ..
                }
            ));
        }
    }
    let ok: Vec<Position> = results.into_iter().filter_map(|r| r.ok()).collect();
    // Still appendable and readable; positions continue after the good ones.
    let p = ml.append(b"after").unwrap();
    assert_eq!(ml.read(p).unwrap(), b"after");
    for (i, g) in good.iter().enumerate() {
        assert_eq!(ml.read(*g).unwrap(), payload(i as u64));
    }
    // Crash image: failed entries never reappear.
    let img = tmp.path().join("img");
    crash_image(tmp.path(), &img, "f");
    ml.close().unwrap();
    for data in [tmp.path(), img.as_path()] {
        let r = ManagedLedger::open(data, "f", opts()).unwrap();
        assert_eq!(r.entry_count() as usize, good.len() + ok.len() + 1);
        assert_eq!(r.read(p).unwrap(), b"after");
        r.close().unwrap();
    }
    // Preallocation failure at rollover (disk full).
    let o = LedgerOptions {
        max_entries_per_ledger: 2,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "g", o.clone()).unwrap();
    ml.append(b"1").unwrap();
    ml.append(b"2").unwrap();
    // Preallocation is an optimization: where it fails, appends go on.
    ml.inject_fault(FaultKind::Preallocate, libc::ENOSPC, 1);
    let p3 = ml.append(b"3").unwrap();
    ml.close().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "g", o).unwrap();
    assert_eq!(ml.entry_count(), 3);
    assert_eq!(ml.read(p3).unwrap(), b"3");
}

#[test]
fn read_only_follows_a_live_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 7,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "live", o.clone()).unwrap();
    let mut pos: Vec<Position> = (0..10).map(|i| ml.append(&payload(i)).unwrap()).collect();
    let ro = ManagedLedger::open(
        tmp.path(),
        "live",
        LedgerOptions {
            read_only: true,
            ..o.clone()
        },
    )
    .unwrap();
    assert_eq!(ro.last_position(), Some(pos[9]));
    assert!(matches!(ro.append(b"x"), Err(Error::ReadOnly(_))));
    pos.extend((10..30).map(|i| ml.append(&payload(i)).unwrap()));
    assert_eq!(ro.last_position(), Some(pos[9]));
    ro.refresh().unwrap();
    assert_eq!(ro.last_position(), Some(pos[29]));
    for (i, p) in pos.iter().enumerate() {
        assert_eq!(ro.read(*p).unwrap(), payload(i as u64));
    }
    let cur = ml.open_cursor("s").unwrap();
    cur.mark_delete(pos[3]).unwrap();
    cur.flush().unwrap();
    ro.refresh().unwrap();
    let rc = ro.open_cursor("s").unwrap();
    assert_eq!(rc.mark_delete_position(), Some(pos[3]));
    assert!(matches!(rc.mark_delete(pos[4]), Err(Error::ReadOnly(_))));
    assert_eq!(rc.read_next(1).unwrap()[0].0, pos[4]);
}

/// Every `.log` file's bytes in a ledger directory.
/// The bytes of every journal segment.
fn journal_bytes(data: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in fs::read_dir(data.join("journal")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "wal") {
            out.extend(fs::read(path).unwrap());
        }
    }
    out
}

#[test]
fn pipelined_groups_after_a_failed_sync_fail_in_order_and_never_reappear() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_bytes_per_ledger: 1 << 20,
        max_batch_bytes: 256 << 10,
        ..opts()
    };
    // Large entries (written from the caller's buffer, pipelined).
    let big = |fill: u8| vec![fill; 100 << 10];
    let ml = ManagedLedger::open(tmp.path(), "pipe", o.clone()).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..40u8 {
        let tx = tx.clone();
        ml.append_async(big(i + 1), Box::new(move |r| tx.send((i, r)).unwrap()));
    }
    let mut good = Vec::new();
    for want in 0..40u8 {
        let (i, r) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(i, want);
        let p = r.unwrap();
        assert!(good.last().is_none_or(|l| p > *l));
        good.push(p);
    }
    assert!(ml.ledgers().len() > 1, "rolled over while pipelined");

    let faults = Arc::clone(ml.fault_injector());
    faults.hold(FaultKind::Sync);
    let (tx, rx) = mpsc::channel();
    let send = |i: u8| {
        let tx = tx.clone();
        ml.append_async(big(200 + i), Box::new(move |r| tx.send((i, r)).unwrap()));
    };
    send(0);
    assert!(faults.wait_held(FaultKind::Sync, Duration::from_secs(20)));
    for i in 1..10u8 {
        send(i);
    }
    // Let the writer thread write them behind the held sync.
    std::thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err());
    faults.inject(FaultKind::Sync, libc::EIO, 1);
    faults.release(FaultKind::Sync);
    for want in 0..10u8 {
        let (i, r) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(i, want);
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    errno: Some(libc::EIO),
                    ..
                })
            ),
            "{r:?}"
        );
    }
    let after = ml.append(b"after").unwrap();
    assert!(after > good[good.len() - 1]);
    let img = tmp.path().join("img");
    crash_image(tmp.path(), &img, "pipe");
    ml.close().unwrap();
    for data in [tmp.path(), img.as_path()] {
        // Cut out of the journal. (Large entries are written into their
        // ledger file directly: a failed one may leave bytes past the end
        // of the file's data there, which nothing refers to and later
        // writes overwrite; the reads below show they never come back.)
        let bytes = journal_bytes(data);
        for i in 0..10u8 {
            let run = vec![200 + i; 1024];
            assert!(
                !bytes.windows(1024).any(|w| w == run.as_slice()),
                "fill {i}"
            );
        }
        let r = ManagedLedger::open(data, "pipe", o.clone()).unwrap();
        assert_eq!(r.entry_count(), 41);
        for (i, p) in good.iter().enumerate() {
            assert_eq!(r.read(*p).unwrap(), big(i as u8 + 1));
        }
        assert_eq!(r.read(after).unwrap(), b"after");
        r.close().unwrap();
    }
}

#[test]
fn read_only_view_never_goes_back_across_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 20,
        checkpoint_interval: Duration::from_millis(1),
        journal_segment_bytes: 8 << 10,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "mono", o.clone()).unwrap();
    ml.append(b"first").unwrap();
    let ro = ManagedLedger::open(
        tmp.path(),
        "mono",
        LedgerOptions {
            read_only: true,
            ..o.clone()
        },
    )
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let writer = std::thread::spawn(move || {
        let mut i = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Acquire) {
            ml.append(&payload(i)).unwrap();
            i += 1;
        }
        ml.close().unwrap();
        i
    });
    let mut last = None;
    let mut count = 0;
    let mut refreshes = 0;
    while refreshes < 300 {
        ro.refresh().unwrap();
        refreshes += 1;
        let now = ro.last_position();
        assert!(now >= last, "went back from {last:?} to {now:?}");
        let c = ro.entry_count();
        assert!(c >= count, "entry count went back from {count} to {c}");
        if let Some(p) = now {
            assert!(ro.read(p).is_ok());
        }
        last = now;
        count = c;
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let written = writer.join().unwrap();
    ro.refresh().unwrap();
    assert_eq!(ro.entry_count(), written + 1);
    // The writer's last checkpoint removed every journal segment: the
    // reader, now reading the ledger files, holds none of them open.
    assert!(ro
        .storage_stats()
        .iter()
        .any(|(k, v)| *k == "journal_segments" && *v == 0));
}

#[test]
fn positions_handed_out_before_a_failed_write_are_never_reused() {
    // append_positioned tells the position before the write is durable; if
    // the write then fails, no later entry may get that position.
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "fenced", opts()).unwrap();
    ml.append(&payload(0)).unwrap();
    let mut handed_out = 0;
    for kind in [FaultKind::Write, FaultKind::Sync] {
        ml.inject_fault(kind, libc::EIO, 1);
        let (tx, rx) = mpsc::channel();
        let (dtx, drx) = mpsc::channel();
        ml.append_positioned(
            payload(1),
            Box::new(move |r| tx.send(r).unwrap()),
            Box::new(move |r| dtx.send(r).unwrap()),
        );
        let given = rx.recv().unwrap();
        assert!(
            drx.recv().unwrap().is_err(),
            "{kind:?}: the write should fail"
        );
        let after = ml.append(&payload(2)).unwrap();
        if let Ok(p) = given {
            handed_out += 1;
            assert_ne!(after, p, "{kind:?}: position {p} handed out twice");
            assert!(after > p, "{kind:?}: {after} is not after {p}");
        }
        assert_eq!(ml.read(after).unwrap(), payload(2));
    }
    // At least one failed write had handed its position out: the check above ran.
    assert!(
        handed_out > 0,
        "no position was handed out before a failed write"
    );
    // The data survives a reopen, in order, and the failed entries are gone.
    let positions: Vec<Position> = ml
        .read_range(Position::new(0, 0), ml.last_position().unwrap())
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(positions.len(), 3);
    drop(ml);
    let ml = ManagedLedger::open(tmp.path(), "fenced", opts()).unwrap();
    let again: Vec<Position> = ml
        .read_range(Position::new(0, 0), ml.last_position().unwrap())
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(again, positions);
}

/// Runs `f` on its own thread; panics if it has not returned within 20 s
/// (a hang fails the test instead of stalling the suite).
#[cfg(feature = "testing")]
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} did not return within 20 s"))
}

#[cfg(feature = "testing")]
#[test]
fn a_panicking_storage_thread_fails_every_caller_and_close_returns() {
    // A bug that panics on a storage thread must not leave a caller
    // waiting forever. Small groups are synced by the writer thread itself,
    // groups of 64 KiB and more by the sync thread: a panic at the sync
    // (FaultKind::Sync) of each, and at the writer's write (Write).
    let cases = [
        (FaultKind::Write, 1usize),
        (FaultKind::Sync, 1),
        (FaultKind::Sync, 100 << 10),
    ];
    for (kind, bytes) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let ml = Arc::new(ManagedLedger::open(tmp.path(), "p", opts()).unwrap());
        let good: Vec<Position> = (0..5).map(|i| ml.append(&payload(i)).unwrap()).collect();
        ml.fault_injector().inject_panic(kind);
        let (tx, rx) = mpsc::channel();
        // One group of `bytes` (in 10 entries), then single appends.
        let big = vec![vec![7u8; bytes.div_ceil(10)]; 10];
        let t = tx.clone();
        ml.append_many_async(big, Box::new(move |r| t.send(r).unwrap()));
        for i in 0..20u64 {
            let tx = tx.clone();
            ml.append_async(
                payload(i),
                Box::new(move |r| tx.send(r.map(|p| vec![p])).unwrap()),
            );
        }
        let results: Vec<_> = (0..21)
            .map(|_| {
                rx.recv_timeout(Duration::from_secs(20))
                    .unwrap_or_else(|_| panic!("{kind:?} {bytes}: an append callback never ran"))
            })
            .collect();
        assert!(results[0].is_err(), "{kind:?} {bytes}: {:?}", results[0]);
        // Later writes fail at once: the journal stopped.
        let m = Arc::clone(&ml);
        match within("a later append", move || m.append(b"later")) {
            Err(Error::Stopped(message)) => assert!(message.contains("panicked"), "{message}"),
            other => panic!("{kind:?} {bytes}: {other:?}"),
        }
        let m = Arc::clone(&ml);
        let closed = within("close", move || m.close());
        assert!(
            closed.is_err(),
            "{kind:?} {bytes}: close after a panic reports it"
        );
        drop(ml);
        // Everything acknowledged is there after reopening, and the
        // directory takes writes again.
        let ml = ManagedLedger::open(tmp.path(), "p", opts()).unwrap();
        for (i, g) in good.iter().enumerate() {
            assert_eq!(ml.read(*g).unwrap(), payload(i as u64));
        }
        for p in results.into_iter().filter_map(Result::ok).flatten() {
            assert!(
                ml.read(p).is_ok(),
                "{kind:?} {bytes}: acknowledged {p} lost"
            );
        }
        let p = ml.append(b"again").unwrap();
        assert_eq!(ml.read(p).unwrap(), b"again");
        ml.close().unwrap();
    }
}

#[cfg(feature = "testing")]
#[test]
fn a_panicking_flusher_is_reported_and_starts_again() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        checkpoint_interval: Duration::from_millis(5),
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "f", o).unwrap();
    let stat = |ml: &ManagedLedger, k: &str| {
        ml.storage_stats()
            .into_iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v)
            .unwrap()
    };
    // The next catalog write (a checkpoint, on the flusher thread) panics.
    ml.fault_injector().inject_panic(FaultKind::Meta);
    ml.append(b"one").unwrap();
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait("the panic is reported", &|| {
        ml.storage_error()
            .is_some_and(|e| e.contains("flusher thread panicked"))
    });
    // Checkpoints go on (the flusher started again) and writes are fine.
    let before = stat(&ml, "checkpoints");
    let p = ml.append(b"two").unwrap();
    wait("a later checkpoint", &|| stat(&ml, "checkpoints") > before);
    assert_eq!(ml.read(p).unwrap(), b"two");
    ml.close().unwrap();
}

#[test]
fn reads_past_the_end_while_appending_do_not_deadlock() {
    // A read past the end built its error under the ledgers' read lock and
    // took that lock again; with the journal thread queued for the write
    // lock (an append being applied) the second read waited behind it, the
    // journal behind the first: every append of the directory hung. Found
    // in review; it stalled within about half a second every run.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "t", opts()).unwrap();
    ml.append(b"first").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    for t in 0..3 {
        let (ml, stop, done) = (Arc::clone(&ml), Arc::clone(&stop), Arc::clone(&done));
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if t == 0 {
                    ml.append_many(vec![b"x".to_vec(); 64]).unwrap();
                } else {
                    let l = ml.last_position().unwrap();
                    let past = Position::new(l.ledger_id, l.entry_id + 1_000_000);
                    assert!(matches!(ml.read(past), Err(Error::PositionNotFound { .. })));
                    // Past the end, or (after a rollover) a gap: no entries.
                    assert!(ml.read_range(past, past).map_or(true, |v| v.is_empty()));
                }
                done[t].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Every thread must keep making progress: 2,000 rounds each, or a stall
    // of 20 s fails the test (the hung threads die with the test process).
    let mut last = vec![0; 3];
    let mut moved = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now: Vec<u64> = done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
        if now.iter().all(|&n| n >= 2_000) {
            break;
        }
        if now != last {
            last = now;
            moved = std::time::Instant::now();
        }
        assert!(
            moved.elapsed() < Duration::from_secs(20),
            "stalled at {last:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}
