//! Managed ledger: lost CATALOG, leftover and unexplained files, recovery of
//! multi-MiB damaged journal records, synced-end hints for read-only
//! readers, ack-after-sync ordering, cursor reads that do not block writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::ledger::catalog::ledger_prefix;
use txnstream_core::ledger::journal;
use txnstream_core::ledger::{FaultInjector, FaultKind, LedgerOptions, ManagedLedger};
use txnstream_core::sink::EntrySink;
use txnstream_core::{Error, Position};

/// Generous bound for "this must not stay blocked": only a deadlock or a
/// missing fix reaches it.
const STUCK: Duration = Duration::from_secs(20);

/// Opens every gate when dropped, so a failing assertion cannot leave the
/// writer (and the ledger's close) stuck at a gate.
struct Gates(Arc<FaultInjector>);

impl Drop for Gates {
    fn drop(&mut self) {
        self.0.clear();
    }
}

fn opts() -> LedgerOptions {
    LedgerOptions {
        preallocate_bytes: 1 << 20,
        // Tests that damage journal records need them still in use.
        checkpoint_interval: Duration::from_secs(3600),
        ..LedgerOptions::default()
    }
}

fn read_only() -> LedgerOptions {
    LedgerOptions {
        read_only: true,
        ..opts()
    }
}

/// Deterministic pseudo-random bytes (xorshift): the worst case for a
/// search that treats every offset as a possible record length.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn log_path(data: &Path, name: &str, id: u64) -> PathBuf {
    txnstream_core::ledger::ledger_file::log_path(&ledger_prefix(data, name).unwrap(), id)
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

/// Offset just past entry `p`: header plus every record up to it.
fn end_of(ml: &ManagedLedger, p: Position) -> u64 {
    32 + ml
        .read_range(Position::new(p.ledger_id, 0), p)
        .unwrap()
        .iter()
        .map(|(_, d)| 8 + d.len() as u64)
        .sum::<u64>()
}

mod support;

/// What a crash leaves: the files as they are, nothing sealed.
fn crash_image(src: &Path, dst: &Path, _name: &str) {
    support::copy_data_dir(src, dst);
}

#[test]
fn missing_catalog_is_an_error_and_removes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 3,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "m", o.clone()).unwrap();
    for i in 0..7u8 {
        ml.append(&[i; 10]).unwrap();
    }
    ml.close().unwrap();
    fs::remove_file(tmp.path().join("CATALOG")).unwrap();
    match ManagedLedger::open(tmp.path(), "m", o.clone()) {
        Err(Error::CorruptLedger { path, reason, .. }) => {
            assert!(path.ends_with("CATALOG"), "{path}");
            assert!(reason.contains("ledgers"), "{reason}");
        }
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
    for id in 1..=3 {
        assert!(log_path(tmp.path(), "m", id).is_file(), "{id}.log removed");
    }
}

#[test]
fn only_provable_leftovers_are_removed_and_newer_files_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 2,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "l", o.clone()).unwrap();
    let pos: Vec<Position> = (0..6u8).map(|i| ml.append(&[i; 20]).unwrap()).collect();
    ml.checkpoint().unwrap();
    let first = fs::read(log_path(tmp.path(), "l", 1)).unwrap();
    let c = ml.open_cursor("c").unwrap();
    c.mark_delete(pos[3]).unwrap();
    ml.flush().unwrap();
    assert_eq!(ml.first_position(), Some(pos[4]));
    assert!(!log_path(tmp.path(), "l", 1).exists());
    ml.close().unwrap();
    // A trimmed ledger not yet unlinked: a provable leftover, removed.
    fs::write(log_path(tmp.path(), "l", 1), &first).unwrap();
    // A ledger newer than the catalog knows (an older CATALOG restored over
    // newer files): it may hold acknowledged entries, so open refuses and
    // names it, removing nothing.
    fs::write(log_path(tmp.path(), "l", 50), &first).unwrap();
    match ManagedLedger::open(tmp.path(), "l", o.clone()) {
        Err(Error::CorruptLedger { reason, .. }) => assert!(reason.contains("@50.log"), "{reason}"),
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
    assert!(log_path(tmp.path(), "l", 50).exists());
    fs::remove_file(log_path(tmp.path(), "l", 50)).unwrap();
    let ml = ManagedLedger::open(tmp.path(), "l", o).unwrap();
    assert!(!log_path(tmp.path(), "l", 1).exists());
    assert_eq!(ml.entry_count(), 2);
    assert_eq!(ml.read(pos[5]).unwrap(), vec![5u8; 20]);
}

/// A ledger holding a small entry, then `big`, then `after` small ones.
fn ledger_with_big_entry(
    data: &Path,
    name: &str,
    big: &[u8],
    after: usize,
) -> (Arc<ManagedLedger>, Vec<Position>) {
    let o = LedgerOptions {
        max_batch_bytes: 64 << 20,
        // These tests damage big records in the journal itself.
        direct_entry_bytes: 0,
        ..opts()
    };
    let ml = ManagedLedger::open(data, name, o).unwrap();
    let mut pos = vec![ml.append(b"first").unwrap(), ml.append(big).unwrap()];
    for i in 0..after {
        pos.push(ml.append(format!("after {i}").as_bytes()).unwrap());
    }
    (ml, pos)
}

#[test]
fn torn_multi_mib_record_is_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let (ml, pos) = ledger_with_big_entry(&live, "t", b"small", 0);
    // The header of an 8 MiB record and the first part of its payload
    // reached the disk, the rest did not.
    let img = tmp.path().join("img");
    crash_image(&live, &img, "t");
    let (journal_file, end) = support::journal_end(&img);
    let payload = noise(8 << 20, 7);
    let mut rec = Vec::new();
    journal::encode_head(
        &mut rec,
        journal::Kind::Entry,
        0,
        1,
        pos[1].ledger_id,
        2,
        &payload,
    );
    rec.extend_from_slice(&payload[..5 << 20]);
    write_at(&journal_file, end, &rec);
    let r = ManagedLedger::open(&img, "t", opts()).unwrap();
    assert_eq!(r.last_position(), Some(pos[1]));
    r.close().unwrap();

    // Pure garbage after the last record: no plausible header at all.
    let img = tmp.path().join("img2");
    crash_image(&live, &img, "t");
    let (journal_file, end) = support::journal_end(&img);
    write_at(&journal_file, end, &noise(8 << 20, 11));
    // A read-only reader stops at the garbage.
    let ro = ManagedLedger::open(&img, "t", read_only()).unwrap();
    assert_eq!(ro.last_position(), Some(pos[1]));
    drop(ro);
    let r = ManagedLedger::open(&img, "t", opts()).unwrap();
    assert_eq!(r.last_position(), Some(pos[1]));
    assert_eq!(r.read(pos[1]).unwrap(), b"small");
    drop(ml);
}

#[test]
fn damaged_multi_mib_records_before_valid_data_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let big = noise(8 << 20, 3);
    let (ml, pos) = ledger_with_big_entry(&live, "d", &big, 2);
    let body = journal::RECORD_HEADER_LEN as u64;

    // One flipped payload bit: later records carry an acknowledged point
    // past it, so it is damage to acknowledged data.
    let img = tmp.path().join("flip");
    crash_image(&live, &img, "d");
    fs::remove_file(img.join("journal/SYNCED")).unwrap();
    let (file, at) = support::entry_record(&img, pos[1]);
    write_at(&file, at + body + 4_000_000, &[big[4_000_000] ^ 0x04]);
    match ManagedLedger::open(&img, "d", opts()) {
        Err(Error::CorruptLedger {
            position, offset, ..
        }) => assert_eq!((position, offset), (pos[1], at)),
        other => panic!("expected CorruptLedger, got {other:?}"),
    }

    // The header zeroed: nothing names the next record, the search must
    // find it 8 MiB further on, through random bytes.
    let img = tmp.path().join("header");
    crash_image(&live, &img, "d");
    fs::remove_file(img.join("journal/SYNCED")).unwrap();
    let (file, at) = support::entry_record(&img, pos[1]);
    write_at(&file, at, &[0u8; 48]);
    match ManagedLedger::open(&img, "d", opts()) {
        Err(Error::CorruptLedger { offset, reason, .. }) => {
            assert_eq!(offset, at);
            assert!(reason.contains("acknowledged point"), "{reason}");
        }
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
    // Nothing was cut.
    let ro = ManagedLedger::open(&live, "d", read_only()).unwrap();
    assert_eq!(ro.last_position(), Some(pos[3]));
    drop(ro);

    // A flipped bit in the last entry of a sealed 16 MiB ledger: trusted at
    // open, caught on read.
    ml.close().unwrap();
    drop(ml);
    let sealed = tmp.path().join("sealed");
    let huge = noise(16 << 20, 5);
    let (ml, pos) = ledger_with_big_entry(&sealed, "s", &huge, 0);
    let at = end_of(&ml, pos[0]);
    ml.close().unwrap();
    write_at(
        &log_path(&sealed, "s", 1),
        at + 8 + 12345,
        &[huge[12345] ^ 1],
    );
    let ml = ManagedLedger::open(&sealed, "s", opts()).unwrap();
    assert_eq!(ml.read(pos[0]).unwrap(), b"first");
    match ml.read(pos[1]) {
        Err(Error::CorruptLedger {
            position, offset, ..
        }) => assert_eq!((position, offset), (pos[1], at)),
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
}

#[test]
fn acknowledgements_wait_for_the_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "a", opts()).unwrap();
    ml.append(b"warm").unwrap();
    let faults = Arc::clone(ml.fault_injector());
    let _gates = Gates(Arc::clone(&faults));
    faults.hold(FaultKind::Sync);
    let (tx, rx) = mpsc::channel();
    for i in 0..20u8 {
        let tx = tx.clone();
        ml.append_async(
            vec![i; 100],
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
    }
    assert!(faults.wait_held(FaultKind::Sync, STUCK));
    // The group is written but not synced: nobody may hear of it yet.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert_eq!(ml.entry_count(), 1);
    faults.release(FaultKind::Sync);
    for _ in 0..20 {
        rx.recv_timeout(STUCK).unwrap().unwrap();
    }
    assert_eq!(ml.entry_count(), 21);
}

#[test]
fn read_only_readers_never_see_unsynced_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(tmp.path(), "r", opts()).unwrap();
    let good: Vec<Position> = (0..3u8).map(|i| ml.append(&[i; 50]).unwrap()).collect();
    let ro = ManagedLedger::open(tmp.path(), "r", read_only()).unwrap();
    assert_eq!(ro.last_position(), Some(good[2]));
    let faults = Arc::clone(ml.fault_injector());
    let _gates = Gates(Arc::clone(&faults));
    faults.hold(FaultKind::Sync);
    let (tx, rx) = mpsc::channel();
    for _ in 0..5 {
        let tx = tx.clone();
        ml.append_async(
            b"doomed".to_vec(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
    }
    assert!(faults.wait_held(FaultKind::Sync, STUCK));
    // The bytes are in the file (page cache) but not durable.
    ro.refresh().unwrap();
    assert_eq!(ro.last_position(), Some(good[2]));
    let fresh = ManagedLedger::open(tmp.path(), "r", read_only()).unwrap();
    assert_eq!(fresh.last_position(), Some(good[2]));
    // The sync fails: the group is cut off, and the next append goes to a
    // new ledger (the failed entries' ids are never given out again).
    ml.inject_fault(FaultKind::Sync, libc::EIO, 1);
    faults.release(FaultKind::Sync);
    for _ in 0..5 {
        assert!(rx.recv_timeout(STUCK).unwrap().is_err());
    }
    let p = ml.append(b"durable").unwrap();
    assert_eq!(p, Position::new(good[2].ledger_id + 1, 0));
    assert_eq!(ml.read(good[2]).unwrap(), vec![2u8; 50]);
    for r in [&ro, &fresh] {
        r.refresh().unwrap();
        assert_eq!(r.last_position(), Some(p));
        assert_eq!(r.read(p).unwrap(), b"durable");
    }
}

#[test]
fn cursor_reads_do_not_block_meta_writes_or_rollover() {
    let tmp = tempfile::tempdir().unwrap();
    let o = LedgerOptions {
        max_entries_per_ledger: 10,
        ..opts()
    };
    let ml = ManagedLedger::open(tmp.path(), "c", o).unwrap();
    let pos: Vec<Position> = (0..10u8).map(|i| ml.append(&[i; 8]).unwrap()).collect();
    let c = ml.open_cursor("c").unwrap();
    let faults = Arc::clone(ml.fault_injector());
    let _gates = Gates(Arc::clone(&faults));
    faults.hold(FaultKind::Read);
    let reader = {
        let c = c.clone();
        std::thread::spawn(move || c.read_next(3))
    };
    assert!(faults.wait_held(FaultKind::Read, STUCK));
    // While the read is held in I/O: persist cursors (META lock, then the
    // cursor's lock), roll over to a new ledger (META lock), move the cursor.
    let (tx, rx) = mpsc::channel();
    {
        let ml = Arc::clone(&ml);
        let c = c.clone();
        let p0 = pos[0];
        std::thread::spawn(move || {
            let r = ml
                .flush()
                .and_then(|()| ml.append(b"rolls over"))
                .and_then(|p| c.mark_delete(p0).map(|()| p));
            tx.send(r).unwrap();
        });
    }
    let rolled = rx
        .recv_timeout(STUCK)
        .expect("blocked by a cursor read")
        .unwrap();
    assert_eq!(rolled.ledger_id, pos[0].ledger_id + 1);
    c.rewind();
    faults.release(FaultKind::Read);
    let got = reader.join().unwrap().unwrap();
    let got: Vec<Position> = got.into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, pos[..3]);
    // The rewind during the read wins: delivery restarts after the
    // mark-delete (pos[0]).
    let again: Vec<Position> = c
        .read_next(2)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(again, pos[1..3]);
    // Without a rewind the read position moves on.
    let next: Vec<Position> = c
        .read_next(2)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(next, pos[3..5]);
}

#[test]
fn large_entries_written_directly_recover_and_damage_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let o = LedgerOptions {
        direct_entry_bytes: 1024,
        ..opts()
    };
    let ml = ManagedLedger::open(&live, "d", o.clone()).unwrap();
    let big = |i: u64| noise(4096 + i as usize * 100, i + 1);
    let mut pos = vec![ml.append(b"opens the ledger").unwrap()];
    for i in 0..6 {
        pos.push(ml.append(&big(i)).unwrap());
    }
    // Only a reference is in the journal: the bytes are written once.
    let recs = support::journal_records(&live);
    assert_eq!(
        recs.iter()
            .filter(|(_, _, h)| h.kind == journal::Kind::EntryRef)
            .count(),
        6
    );
    assert!(recs.iter().all(|(_, _, h)| h.body_len < 100));
    let check = |data: &Path| {
        let r = ManagedLedger::open(data, "d", o.clone()).unwrap();
        for (i, p) in pos[1..].iter().enumerate() {
            assert_eq!(r.read(*p).unwrap(), big(i as u64));
        }
        r.close().unwrap();
    };
    // A crash image recovers them (from the ledger file, through the
    // journal's references).
    let img = tmp.path().join("img");
    crash_image(&live, &img, "d");
    check(&img);
    // One flipped byte in an acknowledged large entry's record: later
    // records carry an acknowledged point past it: reported, nothing cut.
    let img = tmp.path().join("flip");
    crash_image(&live, &img, "d");
    fs::remove_file(img.join("journal/SYNCED")).unwrap();
    let log = log_path(&img, "d", pos[3].ledger_id);
    let mut b = fs::read(&log).unwrap();
    let data_start = 32 + 8 + b"opens the ledger".len() + 8 + big(0).len() + 8 + big(1).len() + 8;
    b[data_start + 100] ^= 1;
    fs::write(&log, &b).unwrap();
    match ManagedLedger::open(&img, "d", o.clone()) {
        Err(Error::CorruptLedger {
            position, reason, ..
        }) => {
            assert_eq!(position, pos[3], "{reason}");
            assert!(reason.contains("does not check out"), "{reason}");
        }
        other => panic!("expected CorruptLedger, got {other:?}"),
    }
    // The last large entry's record torn (its group never synced in a
    // power cut) and nothing acknowledges it: a torn tail, cut.
    let img = tmp.path().join("torn");
    crash_image(&live, &img, "d");
    fs::remove_file(img.join("journal/SYNCED")).unwrap();
    let log = log_path(&img, "d", pos[6].ledger_id);
    let len = fs::metadata(&log).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let r = ManagedLedger::open(&img, "d", o.clone()).unwrap();
    assert_eq!(r.last_position(), Some(pos[5]));
    r.close().unwrap();
    // A clean close writes them behind (indexes) and reopens from files.
    ml.close().unwrap();
    check(&live);
}

#[test]
fn ledger_opened_after_recovery_wrote_its_file_is_not_missing() {
    // After a crash, the first open of the directory replays the journal;
    // the write-behind then writes the files of ledgers nobody opened yet.
    // Opening one of them later must find that file, not call it missing
    // because the directory listing predates it.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    let a = ManagedLedger::open(&src, "a", opts()).unwrap();
    let b = ManagedLedger::open(&src, "b", opts()).unwrap();
    a.append(b"first").unwrap();
    let pos: Vec<Position> = (0..3u8).map(|i| b.append(&[i; 16]).unwrap()).collect();
    crash_image(&src, &dst, "b");
    a.close().unwrap();
    b.close().unwrap();
    let a = ManagedLedger::open(&dst, "a", opts()).unwrap();
    a.checkpoint().unwrap();
    assert!(log_path(&dst, "b", pos[0].ledger_id).is_file());
    let b = ManagedLedger::open(&dst, "b", opts()).unwrap();
    assert_eq!(b.read(pos[2]).unwrap(), vec![2u8; 16]);
    b.close().unwrap();
    a.close().unwrap();
}
