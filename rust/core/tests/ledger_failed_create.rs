//! A managed ledger whose creation record failed does not come back after a
//! crash: a checkpoint taken while the creation was in flight used to list
//! it in the CATALOG (nothing rewrote that catalog before the crash).
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use txnstream_core::ledger::fs::Fs;
use txnstream_core::ledger::simfs::SimFs;
use txnstream_core::ledger::{FaultInjector, FaultKind, LedgerOptions, ManagedLedger};

const DATA: &str = "/data";

fn checkpoints(ml: &ManagedLedger) -> u64 {
    ml.storage_stats()
        .iter()
        .find(|(k, _)| *k == "checkpoints")
        .map(|s| s.1)
        .unwrap()
}

/// Waits (bounded) until `ml`'s directory has run more than `n` checkpoints.
fn checkpoint_after(ml: &ManagedLedger, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while checkpoints(ml) <= n {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// A directory on a simulated disk with fault injection, ledger "keep"
/// holding one entry, and a checkpoint taken: its next checkpoint is due one
/// second after the journal grows (while the test holds what it races).
fn checkpointed_directory() -> (
    Arc<SimFs>,
    Arc<FaultInjector>,
    LedgerOptions,
    Arc<ManagedLedger>,
) {
    let fs = Arc::new(SimFs::new());
    let inj = Arc::new(FaultInjector::new());
    let o = LedgerOptions {
        fs: Some(Arc::clone(&fs) as Arc<dyn Fs>),
        fault_injector: Some(Arc::clone(&inj)),
        preallocate_bytes: 0,
        checkpoint_interval: Duration::from_secs(1),
        ..LedgerOptions::default()
    };
    let keep = ManagedLedger::open(Path::new(DATA), "keep", o.clone()).unwrap();
    keep.append(b"1").unwrap();
    assert!(checkpoint_after(&keep, checkpoints(&keep)));
    (fs, inj, o, keep)
}

#[test]
fn a_failed_creation_is_not_brought_back_by_a_checkpoint_and_a_crash() {
    let (fs, inj, o, keep) = checkpointed_directory();
    keep.append(b"2").unwrap(); // the journal grew: a checkpoint is due in 1 s
    let n = checkpoints(&keep);
    inj.hold(FaultKind::Sync);
    let o2 = o.clone();
    let create = std::thread::spawn(move || ManagedLedger::open(Path::new(DATA), "x", o2));
    assert!(inj.wait_held(FaultKind::Sync, Duration::from_secs(30)));
    assert!(
        checkpoint_after(&keep, n),
        "no checkpoint ran while the creation was held"
    );
    inj.inject(FaultKind::Sync, libc::EIO, 1);
    inj.release(FaultKind::Sync);
    assert!(create.join().unwrap().is_err(), "the creation failed");
    // A crash now (before any later checkpoint rewrites the catalog).
    let image = Arc::new(fs.power_cut(7));
    inj.clear();
    drop(keep);
    let o3 = LedgerOptions {
        fs: Some(Arc::clone(&image) as Arc<dyn Fs>),
        preallocate_bytes: 0,
        ..LedgerOptions::default()
    };
    let keep = ManagedLedger::open(Path::new(DATA), "keep", o3.clone()).unwrap();
    assert_eq!(keep.entry_count(), 2);
    let ro = LedgerOptions {
        read_only: true,
        ..o3
    };
    match ManagedLedger::open(Path::new(DATA), "x", ro) {
        Err(txnstream_core::Error::Io { errno: Some(e), .. }) if e == libc::ENOENT => {}
        other => panic!("the failed creation came back: {other:?}"),
    }
    keep.close().unwrap();
}

/// A ledger created while a checkpoint is between its two reads of the
/// directory (its list of ledgers and the next ledger id) never makes the
/// directory unreadable. The checkpoint read the next id first: a ledger
/// created in between was listed with that same id, and after a crash the
/// next open refused the whole directory ("listed twice or with a bad id").
#[test]
fn a_ledger_created_during_a_checkpoint_keeps_the_directory_readable() {
    let (fs, inj, o, keep) = checkpointed_directory();
    let n = checkpoints(&keep);
    inj.hold(FaultKind::Checkpoint);
    keep.append(b"2").unwrap(); // the journal grew: a checkpoint is due in 1 s
    assert!(inj.wait_held(FaultKind::Checkpoint, Duration::from_secs(30)));
    // Created (durably) while the checkpoint is held between its two reads.
    let (tx, rx) = std::sync::mpsc::channel();
    let o2 = o.clone();
    std::thread::spawn(move || {
        let x = ManagedLedger::open(Path::new(DATA), "x", o2).and_then(|x| {
            x.append(b"x1")?;
            Ok(x)
        });
        let _ = tx.send(x);
    });
    let x = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the creation waited for the held checkpoint")
        .unwrap();
    inj.release(FaultKind::Checkpoint);
    assert!(
        checkpoint_after(&keep, n),
        "the held checkpoint did not finish"
    );
    // A crash now, before a later checkpoint rewrites the catalog.
    let image = Arc::new(fs.power_cut(11));
    inj.clear();
    drop(x);
    drop(keep);
    let o3 = LedgerOptions {
        fs: Some(Arc::clone(&image) as Arc<dyn Fs>),
        preallocate_bytes: 0,
        ..LedgerOptions::default()
    };
    let keep = ManagedLedger::open(Path::new(DATA), "keep", o3.clone()).unwrap();
    assert_eq!(keep.entry_count(), 2);
    let x = ManagedLedger::open(Path::new(DATA), "x", o3.clone()).unwrap();
    assert_eq!(x.entry_count(), 1);
    // Ids stay distinct: a ledger created now is a third one.
    let y = ManagedLedger::open(Path::new(DATA), "y", o3).unwrap();
    y.append(b"y1").unwrap();
    y.close().unwrap();
    x.close().unwrap();
    keep.close().unwrap();
}
