//! Property tests of every storage decoder: arbitrary bytes as a journal
//! segment, a catalog, a ledger's data and index files never panic and
//! never return unverified data; and a failed creation record keeps every
//! later record of that ledger out of the journal.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use txnstream_core::ledger::catalog::decode_catalog;
use txnstream_core::ledger::fs::{Fs, OpenMode};
use txnstream_core::ledger::journal::{self, Kind};
use txnstream_core::ledger::ledger_file::{self, LedgerFiles};
use txnstream_core::ledger::simfs::SimFs;
use txnstream_core::ledger::{FaultKind, LedgerOptions, ManagedLedger};
use txnstream_core::Error;

fn file_with(fs: &SimFs, path: &Path, bytes: &[u8]) -> Arc<dyn txnstream_core::ledger::fs::FsFile> {
    let f = fs.open(path, OpenMode::CREATE).unwrap();
    f.write_all_at(bytes, 0).unwrap();
    f
}

/// A valid segment with a few records, for mutation.
fn valid_segment() -> Vec<u8> {
    let mut seg = journal::encode_segment_header(0).to_vec();
    let mut lac = 0;
    for i in 0..6u64 {
        let body = vec![i as u8; (i * 7) as usize];
        let at = seg.len() as u64 - journal::SEGMENT_HEADER_LEN;
        journal::encode_head(&mut seg, Kind::Entry, lac, 1, 1, i, &body);
        seg.extend_from_slice(&body);
        lac = at;
    }
    seg
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn journal_scan_never_panics_nor_invents_records(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 0..6),
        mutate_valid in any::<bool>(),
    ) {
        let fs = SimFs::new();
        let mut data = if mutate_valid { valid_segment() } else { bytes };
        if !data.is_empty() {
            for (at, x) in flips {
                let n = data.len();
                data[at % n] ^= x;
            }
        }
        let path = Path::new("/s.wal");
        let f = file_with(&fs, path, &data);
        if journal::check_segment_header(f.as_ref(), path, 0).is_ok() {
            let mut seen = Vec::new();
            let scan = journal::scan_segment(f.as_ref(), path, 0, 0, None, |s| {
                // Whatever is returned checks out against its own checksums.
                assert_eq!(journal::body_crc(s.body), s.head.body_crc);
                seen.push(s.at);
                Ok(())
            });
            if let Ok(scan) = scan {
                prop_assert!(seen.iter().all(|&a| a < scan.end.max(1)));
                if let Some(d) = scan.damage {
                    journal::max_lac_after(f.as_ref(), path, 0, d.at).unwrap();
                }
            }
        }
    }

    #[test]
    fn catalog_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        match decode_catalog(Path::new("/CATALOG"), &bytes) {
            Ok(_) | Err(Error::CorruptLedger { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e:?}"),
        }
    }

    #[test]
    fn ledger_file_reads_verify_everything(
        entries in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8),
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255, any::<bool>()), 1..4),
    ) {
        let fs = SimFs::new();
        let log = fs.open(Path::new("/x@1.log"), OpenMode::CREATE).unwrap();
        let idx = fs.open(Path::new("/x@1.idx"), OpenMode::CREATE).unwrap();
        log.write_all_at(&ledger_file::encode_header(1, false), 0).unwrap();
        idx.write_all_at(&ledger_file::encode_header(1, true), 0).unwrap();
        let files = LedgerFiles {
            id: 1,
            log: log.as_ref(),
            log_path: Path::new("/x@1.log"),
            idx: idx.as_ref(),
            idx_path: Path::new("/x@1.idx"),
        };
        let recs: Vec<ledger_file::NewRecord<'_>> = entries
            .iter()
            .map(|e| ledger_file::NewRecord {
                payload: Some(e.as_slice()),
                len: e.len() as u32,
                crc: journal::body_crc(e),
            })
            .collect();
        ledger_file::append(&files, 0, ledger_file::HEADER_LEN, &recs).unwrap();
        prop_assert_eq!(files.read(0, entries.len() as u64).unwrap(), entries.clone());
        for (at, x, in_idx) in flips {
            let f = if in_idx { &idx } else { &log };
            let n = f.size().unwrap() as usize;
            let off = (at % (n - 32)) as u64 + 32;
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, off).unwrap();
            f.write_all_at(&[b[0] ^ x], off).unwrap();
        }
        // Every entry read back is either the original or an error.
        for (i, e) in entries.iter().enumerate() {
            match files.read(i as u64, 1) {
                Ok(v) => prop_assert_eq!(&v[0], e),
                Err(Error::CorruptLedger { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {other:?}"),
            }
        }
    }
}

#[test]
fn a_failed_creation_keeps_the_ledgers_records_out_of_the_journal() {
    let fs = Arc::new(SimFs::new());
    let o = LedgerOptions {
        fs: Some(Arc::clone(&fs) as Arc<dyn Fs>),
        ..LedgerOptions::default()
    };
    let keep = ManagedLedger::open(Path::new("/d"), "keep", o.clone()).unwrap();
    keep.append(b"k").unwrap();
    keep.inject_fault(FaultKind::Sync, libc::EIO, 1);
    // The creation record's group fails: the open reports it.
    let r = ManagedLedger::open(Path::new("/d"), "new", o.clone());
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
    // The name is free again; a second open creates it for real.
    let ml = ManagedLedger::open(Path::new("/d"), "new", o.clone()).unwrap();
    let p = ml.append(b"n").unwrap();
    ml.close().unwrap();
    keep.close().unwrap();
    let again = ManagedLedger::open(Path::new("/d"), "new", o).unwrap();
    assert_eq!(again.read(p).unwrap(), b"n");
    assert_eq!(again.entry_count(), 1);
}
