//! A deleted managed ledger's name can be created again, fresh and empty:
//! in the same store session, after a reopen, and after a power cut between
//! the deletion and the new creation (or just after it).
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::ledger::fs::Fs;
use txnstream_core::ledger::simfs::SimFs;
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::Position;

const DATA: &str = "/data";

fn sim_opts(fs: &Arc<SimFs>) -> LedgerOptions {
    LedgerOptions {
        fs: Some(Arc::clone(fs) as Arc<dyn Fs>),
        // No background checkpoint: each test decides when one runs.
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes: 1 << 30,
        preallocate_bytes: 0,
        ..LedgerOptions::default()
    }
}

fn open(fs: &Arc<SimFs>, name: &str) -> Arc<ManagedLedger> {
    ManagedLedger::open(Path::new(DATA), name, sim_opts(fs))
        .unwrap_or_else(|e| panic!("opening {name:?}: {e}"))
}

/// Every entry of `ml`, in order.
fn entries(ml: &ManagedLedger) -> Vec<Vec<u8>> {
    match (ml.first_position(), ml.last_position()) {
        (Some(a), Some(b)) => ml
            .read_range(a, b)
            .unwrap()
            .into_iter()
            .map(|(_, d)| d)
            .collect(),
        _ => Vec::new(),
    }
}

/// "a" with `n` old entries (over two ledgers), deleted; `keep` holds the
/// store open. Returns the old positions.
fn delete_old(fs: &Arc<SimFs>, keep: &ManagedLedger, checkpoint: bool) -> Vec<Position> {
    let o = LedgerOptions {
        max_entries_per_ledger: 3,
        ..sim_opts(fs)
    };
    let a = ManagedLedger::open(Path::new(DATA), "a", o).unwrap();
    let old: Vec<Position> = (0..5u8).map(|i| a.append(&[b'o', i]).unwrap()).collect();
    a.open_cursor("sub").unwrap();
    if checkpoint {
        a.checkpoint().unwrap();
    }
    a.delete().unwrap();
    drop(a);
    assert!(!keep.is_closed());
    old
}

fn check_fresh(a: &ManagedLedger, old: &[Position], new: &[Vec<u8>]) {
    assert_eq!(
        entries(a),
        new,
        "the re-created ledger holds exactly its own entries"
    );
    assert_eq!(a.entry_count(), new.len() as u64);
    assert!(
        !a.cursor_names().contains(&"sub".to_owned()),
        "the old cursor is gone: {:?}",
        a.cursor_names()
    );
    for p in old {
        if let Ok(d) = a.read(*p) {
            assert!(new.contains(&d), "old entry {p} visible: {d:?}");
        }
    }
}

fn recreate_in_session(checkpoint: bool) {
    let fs = Arc::new(SimFs::new());
    let keep = open(&fs, "keep");
    let old = delete_old(&fs, &keep, checkpoint);
    let a = open(&fs, "a");
    check_fresh(&a, &old, &[]);
    let new: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'n', i]).collect();
    for d in &new {
        a.append(d).unwrap();
    }
    check_fresh(&a, &old, &new);
    // A reader of the live directory (the journal tail) sees the same.
    let ro = LedgerOptions {
        read_only: true,
        ..sim_opts(&fs)
    };
    let r = ManagedLedger::open(Path::new(DATA), "a", ro.clone()).unwrap();
    check_fresh(&r, &old, &new);
    // The old ledger's files go with a checkpoint: the new ones stay.
    a.checkpoint().unwrap();
    check_fresh(&a, &old, &new);
    r.refresh().unwrap();
    check_fresh(&r, &old, &new);
    r.close().unwrap();
    a.close().unwrap();
    keep.close().unwrap();
    drop((a, keep));
    let a = open(&fs, "a");
    check_fresh(&a, &old, &new);
    a.close().unwrap();
    drop(a);
    let r = ManagedLedger::open(Path::new(DATA), "a", ro).unwrap();
    check_fresh(&r, &old, &new);
    r.close().unwrap();
}

#[test]
fn a_deleted_name_is_created_again_fresh_in_the_same_session() {
    recreate_in_session(false);
}

#[test]
fn a_deleted_name_whose_files_were_checkpointed_is_created_again_fresh() {
    recreate_in_session(true);
}

#[test]
fn a_name_deleted_and_created_again_many_times_between_checkpoints_keeps_the_newest() {
    let fs = Arc::new(SimFs::new());
    let keep = open(&fs, "keep");
    let mut old = delete_old(&fs, &keep, false);
    let mut last = Vec::new();
    for round in 0..4u8 {
        let a = open(&fs, "a");
        check_fresh(&a, &old, &[]);
        last = (0..3u8).map(|i| vec![b'r', round, i]).collect();
        for d in &last {
            old.push(a.append(d).unwrap());
        }
        check_fresh(&a, &old, &last);
        if round < 3 {
            a.delete().unwrap();
        } else {
            a.checkpoint().unwrap();
            check_fresh(&a, &old, &last);
            a.close().unwrap();
        }
    }
    keep.close().unwrap();
    drop(keep);
    let a = open(&fs, "a");
    check_fresh(&a, &old, &last);
    a.close().unwrap();
}

#[test]
fn a_deleted_name_is_created_again_fresh_after_a_reopen() {
    let fs = Arc::new(SimFs::new());
    let keep = open(&fs, "keep");
    let old = delete_old(&fs, &keep, true);
    keep.close().unwrap();
    drop(keep);
    let a = open(&fs, "a");
    check_fresh(&a, &old, &[]);
    a.append(b"new").unwrap();
    check_fresh(&a, &old, &[b"new".to_vec()]);
    a.close().unwrap();
}

#[test]
fn power_cuts_between_a_delete_and_the_new_creation_leave_a_fresh_ledger() {
    for seed in 0..30u64 {
        for checkpoint in [false, true] {
            let fs = Arc::new(SimFs::new());
            let keep = open(&fs, "keep");
            let old = delete_old(&fs, &keep, checkpoint);
            // Cut 1: after the delete (durable), before the new creation.
            let image1 = Arc::new(fs.power_cut(seed));
            let a = open(&fs, "a");
            let new: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'n', i]).collect();
            for d in &new {
                a.append(d).unwrap();
            }
            // Cut 2: after the new creation and its acknowledged appends.
            let image2 = Arc::new(fs.power_cut(seed ^ 0x5eed));
            drop((a, keep));

            let a = ManagedLedger::open(Path::new(DATA), "a", sim_opts(&image1))
                .unwrap_or_else(|e| panic!("seed {seed}/{checkpoint}: reopen after cut 1: {e}"));
            check_fresh(&a, &old, &[]);
            a.append(b"x").unwrap();
            check_fresh(&a, &old, &[b"x".to_vec()]);
            a.close().unwrap();
            drop(a);

            let a = ManagedLedger::open(Path::new(DATA), "a", sim_opts(&image2))
                .unwrap_or_else(|e| panic!("seed {seed}/{checkpoint}: reopen after cut 2: {e}"));
            check_fresh(&a, &old, &new);
            a.checkpoint().unwrap();
            a.close().unwrap();
            drop(a);
            let a = ManagedLedger::open(Path::new(DATA), "a", sim_opts(&image2)).unwrap();
            check_fresh(&a, &old, &new);
            a.close().unwrap();
        }
    }
}
