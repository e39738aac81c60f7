//! Power cuts: a simulated file system (`SimFs`) that, at a cut, drops or
//! reorders every write not covered by a sync and loses unsynced directory
//! changes. A kill -9 test cannot see a missing fsync (the page cache
//! survives a process); these can. Many random cut points, each checked:
//! recovery always succeeds and every acknowledged entry is there, intact.
//!
//! `TXNSTREAM_POWER_CUT_ROUNDS` sets the number of rounds (default 40).
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::ledger::fs::Fs;
use txnstream_core::ledger::simfs::{Rng, SimFs};
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::sync::Mutex;
use txnstream_core::{Error, Position};

const DATA: &str = "/data";

fn rounds() -> u64 {
    std::env::var("TXNSTREAM_POWER_CUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn opts(fs: &Arc<SimFs>) -> LedgerOptions {
    LedgerOptions {
        fs: Some(Arc::clone(fs) as Arc<dyn Fs>),
        max_entries_per_ledger: 7,
        preallocate_bytes: 8 << 10,
        journal_segment_bytes: 16 << 10,
        checkpoint_bytes: 24 << 10,
        checkpoint_interval: Duration::from_millis(5),
        cursor_flush_interval: Duration::from_millis(2),
        // Most entries are "large": written straight into ledger files.
        direct_entry_bytes: 100,
        ..LedgerOptions::default()
    }
}

fn payload(ml: usize, i: u64) -> Vec<u8> {
    let n = ((i * 37 + ml as u64 * 11) % 300) as usize + 1;
    (0..n).map(|k| (i as usize * 131 + k + ml) as u8).collect()
}

type Acked = Arc<Mutex<BTreeMap<(usize, Position), Vec<u8>>>>;

/// Several managed ledgers appending at once (single, many, async), with
/// cursors trimming some of them and checkpoints running often; cut the
/// power at a random moment; recover the image and check it.
#[test]
fn random_power_cuts_keep_every_acknowledged_entry() {
    for round in 0..rounds() {
        let mut rng = Rng::new(0xC0FFEE + round);
        let fs = Arc::new(SimFs::new());
        // Odd rounds: the writer thread syncs its own groups (2 threads).
        let o = LedgerOptions {
            storage_threads: 2 + (round % 2) as usize,
            ..opts(&fs)
        };
        let mls: Vec<Arc<ManagedLedger>> = (0..4)
            .map(|i| ManagedLedger::open(Path::new(DATA), &format!("ns/t{i}"), o.clone()).unwrap())
            .collect();
        let acked: Acked = Arc::new(Mutex::new(BTreeMap::new()));
        // Mark-delete positions issued per ledger (entries at or before it
        // may be trimmed away after recovery).
        let marks: Arc<Mutex<BTreeMap<usize, Position>>> = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for (k, ml) in mls.iter().enumerate() {
            let ml = Arc::clone(ml);
            let acked = Arc::clone(&acked);
            let marks = Arc::clone(&marks);
            let stop = Arc::clone(&stop);
            let seed = rng.next_u64();
            workers.push(std::thread::spawn(move || {
                let mut r = Rng::new(seed);
                let cursor = ml.open_cursor("c").unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    match r.below(4) {
                        0 => {
                            let n = 1 + r.below(5);
                            let data: Vec<Vec<u8>> = (i..i + n).map(|j| payload(k, j)).collect();
                            let ps = ml.append_many(data.clone()).unwrap();
                            let mut a = acked.lock();
                            for (p, d) in ps.into_iter().zip(data) {
                                a.insert((k, p), d);
                            }
                            i += n;
                        }
                        1 if k % 2 == 0 => {
                            // Trim: acknowledge up to a recent entry.
                            if let Some(last) = ml.last_position() {
                                if r.below(3) == 0 {
                                    // Recorded first: it may take effect
                                    // (and trim) before mark_delete returns.
                                    marks.lock().insert(k, last);
                                    cursor.mark_delete(last).unwrap();
                                }
                            }
                        }
                        _ => {
                            let d = payload(k, i);
                            let p = ml.append(&d).unwrap();
                            acked.lock().insert((k, p), d);
                            i += 1;
                        }
                    }
                }
            }));
        }
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        // Everything acknowledged before the cut must survive it.
        let must = acked.lock().clone();
        let image = fs.power_cut(rng.next_u64());
        // Marks recorded by the end of the cut (each is recorded before it
        // can take effect, so every trim in the image is covered).
        let marked = marks.lock().clone();
        stop.store(true, Ordering::Release);
        for w in workers {
            w.join().unwrap();
        }
        for ml in &mls {
            ml.close().unwrap();
        }
        check_image(round, image, &must, &marked);
    }
}

fn check_image(
    round: u64,
    image: SimFs,
    must: &BTreeMap<(usize, Position), Vec<u8>>,
    marked: &BTreeMap<usize, Position>,
) {
    let image = Arc::new(image);
    let o = opts(&image);
    for k in 0..4usize {
        let ml = ManagedLedger::open(Path::new(DATA), &format!("ns/t{k}"), o.clone())
            .unwrap_or_else(|e| panic!("round {round}: open t{k} after the cut: {e}"));
        for ((kk, p), d) in
            must.range((k, Position::new(0, 0))..=(k, Position::new(u64::MAX, u64::MAX)))
        {
            assert_eq!(*kk, k);
            match ml.read(*p) {
                Ok(got) => assert_eq!(&got, d, "round {round}: t{k} {p} differs"),
                // Trimmed: only entries at or before an issued mark-delete.
                Err(Error::PositionNotFound { .. }) => assert!(
                    marked.get(&k).is_some_and(|m| p <= m),
                    "round {round}: acknowledged t{k} {p} lost after the cut"
                ),
                Err(e) => panic!("round {round}: t{k} {p}: {e}"),
            }
        }
        ml.close().unwrap();
    }
    // And a second recovery of the recovered image is clean too.
    for k in 0..4usize {
        let ml = ManagedLedger::open(Path::new(DATA), &format!("ns/t{k}"), o.clone()).unwrap();
        ml.close().unwrap();
    }
}

/// A failed sync leaves the failed bytes on disk (Linux marks the pages
/// clean after a failed writeback): unless the cut-back is itself synced, a
/// power cut could bring back entries whose callers were told they failed.
#[test]
fn failed_sync_cut_back_is_durable() {
    for seed in 0..20u64 {
        let fs = Arc::new(SimFs::new());
        let o = opts(&fs);
        let ml = ManagedLedger::open(Path::new(DATA), "f", o.clone()).unwrap();
        let good: Vec<Position> = (0..5).map(|i| ml.append(&payload(0, i)).unwrap()).collect();
        fs.fail_next_syncs(1);
        let failed = ml.append(b"FAILED-ENTRY");
        assert!(
            matches!(
                failed,
                Err(Error::Io {
                    errno: Some(libc::EIO),
                    ..
                })
            ),
            "{failed:?}"
        );
        let image = Arc::new(fs.power_cut(seed));
        ml.close().unwrap();
        let r = ManagedLedger::open(Path::new(DATA), "f", opts(&image)).unwrap();
        assert_eq!(r.entry_count(), 5, "seed {seed}: a failed entry came back");
        for (i, p) in good.iter().enumerate() {
            assert_eq!(r.read(*p).unwrap(), payload(0, i as u64));
        }
        r.close().unwrap();
    }
}

/// A data directory, its journal and its ledger directories survive a
/// power cut right after they were created and used: every new name is
/// synced in its parent before anything depends on it.
#[test]
fn new_directories_survive_a_power_cut() {
    for seed in 0..20u64 {
        let fs = Arc::new(SimFs::new());
        fs.create_dir(Path::new("/deep")).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        let data = Path::new("/deep/a/b/data");
        let o = opts(&fs);
        let ml = ManagedLedger::open(data, "x/y", o.clone()).unwrap();
        let p = ml.append(b"hello").unwrap();
        ml.checkpoint().unwrap();
        let q = ml.append(b"again").unwrap();
        let image = Arc::new(fs.power_cut(seed));
        ml.close().unwrap();
        let r = ManagedLedger::open(data, "x/y", opts(&image))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(r.read(p).unwrap(), b"hello");
        assert_eq!(r.read(q).unwrap(), b"again");
        r.close().unwrap();
    }
}
