//! Managed ledger inputs at the edges of `u64`, from callers and from disk:
//! a position at `u64::MAX`, a scan bound far past a ledger's end, and
//! checksum-valid records or catalogs whose ids or counts cannot be real.
//! Each gets a typed error (or an empty answer) and never a panic or a scan
//! that runs for ever.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use txnstream_core::columns::TxnLogColumns;
use txnstream_core::ledger::catalog::{read_catalog, write_catalog};
use txnstream_core::ledger::fs::{Fs, OpenMode, RealFs};
use txnstream_core::ledger::journal::{self, Kind};
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::log_scan::scan_ledger;
use txnstream_core::{Error, Position};

/// Generous bound for "this must return": only a missing fix reaches it.
const STUCK: Duration = Duration::from_secs(20);

fn opts() -> LedgerOptions {
    LedgerOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..LedgerOptions::default()
    }
}

fn one_entry(dir: &Path) -> Position {
    let ml = ManagedLedger::open(dir, "t", opts()).unwrap();
    let p = ml.append(b"x").unwrap();
    ml.close().unwrap();
    p
}

#[test]
fn a_read_at_the_last_entry_id_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let ml = ManagedLedger::open(dir.path(), "t", opts()).unwrap();
    let p = ml.append(b"x").unwrap();
    let far = Position::new(p.ledger_id, u64::MAX);
    assert!(matches!(ml.read(far), Err(Error::PositionNotFound { .. })));
    let all = ml.read_range(Position::new(p.ledger_id, 0), far).unwrap();
    assert_eq!(all, vec![(p, b"x".to_vec())]);
}

#[test]
fn a_scan_bound_far_past_a_ledgers_end_reads_what_the_ledger_holds() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LedgerOptions {
        max_entries_per_ledger: 2,
        ..opts()
    };
    let ml = ManagedLedger::open(dir.path(), "log", opts).unwrap();
    let ps: Vec<Position> = (0..4u8).map(|i| ml.append(&[0x08, i]).unwrap()).collect();
    let first = ps[0].ledger_id;
    assert_ne!(first, ps[3].ledger_id, "two ledgers");
    let (tx, rx) = mpsc::channel();
    let scanner = ml.clone();
    std::thread::spawn(move || {
        let scan = |ledger: u64, from: u64, to: u64| {
            scan_ledger::<TxnLogColumns>(&scanner, ledger, from, to, &[], 100).map(|s| s.entries)
        };
        // A sealed ledger with a later one after it (stepped through 2^62 ids
        // 256 at a time), a ledger that never existed, and bounds at u64::MAX.
        let _ = tx.send([
            scan(first, 0, 1 << 62),
            scan(first - 1, 0, u64::MAX),
            scan(first, u64::MAX - 300, u64::MAX),
        ]);
    });
    let [sealed, missing, edge] = rx.recv_timeout(STUCK).expect("a scan ran on and on");
    assert_eq!(sealed.unwrap(), 2);
    assert_eq!(missing.unwrap(), 0);
    assert_eq!(edge.unwrap(), 0);
}

/// Appends one checksum-valid journal record after the last one, where the
/// next open replays it.
fn inject(dir: &Path, kind: Kind, ml: u64, a: u64, body: &[u8]) {
    let fs = RealFs::new();
    let mut segs: Vec<u64> = std::fs::read_dir(dir.join(journal::JOURNAL_DIR))
        .unwrap()
        .filter_map(|e| journal::parse_segment_name(e.unwrap().file_name().to_str()?))
        .collect();
    segs.sort_unstable();
    let base = match segs.last() {
        Some(&b) => b,
        None => {
            let b = read_catalog(&fs, dir).unwrap().unwrap().checkpoint;
            let header = journal::encode_segment_header(b);
            std::fs::write(journal::segment_path(dir, b), header).unwrap();
            b
        }
    };
    let path = journal::segment_path(dir, base);
    let f = fs.open(&path, OpenMode::READ).unwrap();
    let scan = journal::scan_segment(f.as_ref(), &path, base, base, None, |_| Ok(())).unwrap();
    let mut rec = Vec::new();
    journal::encode_head(&mut rec, kind, 0, ml, a, 0, body);
    rec.extend_from_slice(body);
    let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    w.write_all_at(&rec, journal::SEGMENT_HEADER_LEN + (scan.end - base))
        .unwrap();
    w.sync_all().unwrap();
}

#[test]
fn journal_records_with_the_last_id_are_damage() {
    // Recovery took them (overflowing to the next id in a debug build), and
    // the catalog written next was one the next open refused.
    for (kind, new_ml, a, body) in [
        (Kind::MlCreate, true, 0, &b"evil"[..]),
        (Kind::LedgerOpen, false, u64::MAX, &b""[..]),
        (Kind::ReplaceBegin, false, u64::MAX, &b""[..]),
        // Its `a` is the name's next ledger id: taken as the floor of its next
        // creation, whose first append then overflowed on the journal writer.
        (Kind::MlDelete, false, u64::MAX, &b""[..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        one_entry(dir.path());
        let cat = read_catalog(&RealFs::new(), dir.path()).unwrap().unwrap();
        let ml = if new_ml { u64::MAX } else { cat.ledgers[0].id }; // "t"'s journal id
        inject(dir.path(), kind, ml, a, body);
        let err = ManagedLedger::open(dir.path(), "t", opts()).map(|_| ());
        assert!(
            matches!(err, Err(Error::CorruptLedger { .. })),
            "{kind:?}: {err:?}"
        );
    }
}

#[test]
fn a_catalog_count_its_files_cannot_hold_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    one_entry(dir.path());
    let fs = RealFs::new();
    let mut cat = read_catalog(&fs, dir.path()).unwrap().unwrap();
    let l = &mut cat.ledgers[0].ledgers[0];
    l.file_entries = Some(1 << 61);
    l.entries = Some(1 << 61);
    write_catalog(&fs, dir.path(), &cat).unwrap(); // a valid checksum
    let err = ManagedLedger::open(dir.path(), "t", opts()).map(|_| ());
    assert!(matches!(err, Err(Error::CorruptLedger { .. })), "{err:?}");
}

#[test]
fn an_entry_reference_larger_than_any_entry_is_malformed() {
    // Readers allocate the length it names before reading (4 GiB here).
    let at = |len: u32| journal::EntryRef {
        offset: 32,
        len,
        crc: 0,
    };
    let max = u32::try_from(txnstream_core::ledger::MAX_ENTRY_SIZE).unwrap();
    assert!(journal::EntryRef::decode(&at(max).encode()).is_some());
    assert!(journal::EntryRef::decode(&at(max + 1).encode()).is_none());
    assert!(journal::EntryRef::decode(&at(u32::MAX).encode()).is_none());
}
