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

/// Ledgers of 3 entries (so a few appends make several ledger files).
fn small_ledgers(fs: &Arc<SimFs>) -> LedgerOptions {
    LedgerOptions {
        max_entries_per_ledger: 3,
        ..sim_opts(fs)
    }
}

// Deleted, checkpointed away and created again under the same name, then a
// power cut: the checkpoint's unlinks of the old files are not synced, so the
// cut may bring them back. Found in review: the checkpoint forgot the name's
// floor (`Store::retired`) once it unlinked them, the name started at ledger
// id 1 again, and after the cut the old files stood next to a catalog that
// no longer explained them (the open was refused, 36 of 40 cuts).

#[test]
fn created_again_after_a_checkpoint_then_a_power_cut() {
    let mut failures = Vec::new();
    for seed in 0..40u64 {
        let fs = Arc::new(SimFs::new());
        let keep = ManagedLedger::open(Path::new(DATA), "keep", small_ledgers(&fs)).unwrap();
        let a = ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&fs)).unwrap();
        for i in 0..5u8 {
            a.append(&[b'o', i]).unwrap(); // ledgers 1 and 2
        }
        a.checkpoint().unwrap(); // a@1, a@2 written and durable
        a.delete().unwrap();
        drop(a);
        keep.checkpoint().unwrap(); // catalog drops "a", unlinks a@1/a@2, forgets the floor
        let ls: Vec<_> = fs.read_dir(Path::new("/data/ledgers")).unwrap();
        let a = ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&fs)).unwrap();
        let p = a.append(b"new").unwrap();
        assert!(
            ls.is_empty(),
            "the checkpoint removed the old files: {ls:?}"
        );
        let image = Arc::new(fs.power_cut(seed));
        drop((a, keep));
        match ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&image)) {
            Ok(a) => {
                let got = a.read(p);
                match got {
                    Ok(d) if d == b"new" => {}
                    other => failures.push(format!("seed {seed}: read {p}: {other:?}")),
                }
                let n = a.entry_count();
                if n != 1 {
                    failures.push(format!("seed {seed}: entry_count {n}, want 1"));
                }
            }
            Err(e) => failures.push(format!("seed {seed}: reopen failed: {e}")),
        }
    }
    for f in &failures {
        println!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} of 40 power cuts failed",
        failures.len()
    );
}

/// Same, the old ledger with one ledger only (a@1): the re-created ledger
/// keeps exactly its data through a checkpoint and a reopen.
#[test]
fn created_again_after_a_checkpoint_then_a_power_cut_one_ledger() {
    let mut failures = Vec::new();
    for seed in 0..40u64 {
        let fs = Arc::new(SimFs::new());
        let keep = ManagedLedger::open(Path::new(DATA), "keep", small_ledgers(&fs)).unwrap();
        let a = ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&fs)).unwrap();
        for i in 0..3u8 {
            a.append(&[b'o', i]).unwrap(); // ledger 1 full
        }
        a.checkpoint().unwrap();
        a.delete().unwrap();
        drop(a);
        keep.checkpoint().unwrap();
        let a = ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&fs)).unwrap();
        let p = a.append(b"new").unwrap();
        let image = Arc::new(fs.power_cut(seed));
        drop((a, keep));
        let step = |what: &str, r: txnstream_core::Result<()>, failures: &mut Vec<String>| {
            if let Err(e) = r {
                failures.push(format!("seed {seed}: {what}: {e}"));
            }
        };
        let a = match ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&image)) {
            Ok(a) => a,
            Err(e) => {
                failures.push(format!("seed {seed}: reopen: {e}"));
                continue;
            }
        };
        step("checkpoint", a.checkpoint(), &mut failures);
        step("close", a.close(), &mut failures);
        drop(a);
        match ManagedLedger::open(Path::new(DATA), "a", small_ledgers(&image)) {
            Ok(a) => {
                let n = a.entry_count();
                let d = a.read(p);
                if n != 1 || !matches!(&d, Ok(d) if d == b"new") {
                    failures.push(format!("seed {seed}: entry_count {n}, read {p}: {d:?}"));
                }
            }
            Err(e) => failures.push(format!("seed {seed}: second reopen: {e}")),
        }
    }
    for f in &failures {
        println!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} of 40 power cuts failed",
        failures.len()
    );
}
