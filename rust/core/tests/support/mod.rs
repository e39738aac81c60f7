//! Helpers shared by the ledger test suites: crash images of a live data
//! directory and a view of its journal records.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use txnstream_core::ledger::fs::{Fs, OpenMode, RealFs};
use txnstream_core::ledger::journal;
use txnstream_core::Position;

/// Copies a live data directory into `dst` (skipping `dst` itself if it is
/// inside, and the lock): what kill -9 would leave behind, since the page
/// cache survives a process.
pub fn copy_data_dir(src: &Path, dst: &Path) {
    copy_tree(src, dst, dst);
}

fn copy_tree(src: &Path, dst: &Path, skip: &Path) {
    fs::create_dir_all(dst).unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.path() == skip {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst.join(e.file_name()), skip);
        } else if e.file_name() != "LOCK" {
            fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

/// Journal records of a data directory: (segment path, file offset of the
/// record, its header), in journal order.
pub fn journal_records(data: &Path) -> Vec<(PathBuf, u64, journal::Head)> {
    let fs = RealFs::new();
    let mut bases: Vec<u64> = fs::read_dir(data.join("journal"))
        .unwrap()
        .filter_map(|e| journal::parse_segment_name(e.unwrap().file_name().to_str().unwrap()))
        .collect();
    bases.sort();
    let mut out = Vec::new();
    for base in bases {
        let path = journal::segment_path(data, base);
        let f = fs.open(&path, OpenMode::READ).unwrap();
        journal::scan_segment(f.as_ref(), &path, base, base, None, |seen| {
            let off = journal::SEGMENT_HEADER_LEN + (seen.at - base);
            out.push((path.clone(), off, seen.head));
            Ok(())
        })
        .unwrap();
    }
    out
}

/// The journal file and file offset of the entry record at `p`.
pub fn entry_record(data: &Path, p: Position) -> (PathBuf, u64) {
    journal_records(data)
        .into_iter()
        .find(|(_, _, h)| h.kind == journal::Kind::Entry && h.position() == p)
        .map(|(path, off, _)| (path, off))
        .expect("no journal record for that position")
}

/// The last journal segment and the file offset just past its last record.
pub fn journal_end(data: &Path) -> (PathBuf, u64) {
    let recs = journal_records(data);
    let (path, off, head) = recs.last().expect("empty journal");
    (path.clone(), off + head.size())
}
