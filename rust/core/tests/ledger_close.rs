//! `close()` returns within the directory's `close_timeout` whatever the
//! disk does: on a journal sync that never returns it fails with an `Io`
//! error of errno `ETIMEDOUT`, the handle is closed, the shutdown finishes
//! in the background once the disk answers, and the next open recovers.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use txnstream_core::ledger::fs::Fs;
use txnstream_core::ledger::simfs::SimFs;
use txnstream_core::ledger::{FaultInjector, FaultKind, LedgerOptions, ManagedLedger};
use txnstream_core::{Error, Position};

const DATA: &str = "/data";
const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
/// Far beyond the close timeout: only a hang takes this long.
const HANG: Duration = Duration::from_secs(60);

fn opts(fs: &Arc<SimFs>, inj: &Arc<FaultInjector>) -> LedgerOptions {
    LedgerOptions {
        fs: Some(Arc::clone(fs) as Arc<dyn Fs>),
        fault_injector: Some(Arc::clone(inj)),
        preallocate_bytes: 0,
        close_timeout: CLOSE_TIMEOUT,
        ..LedgerOptions::default()
    }
}

/// Closes `ml` on another thread; its result, or `None` if it hangs.
fn close_within(ml: &Arc<ManagedLedger>, limit: Duration) -> Option<txnstream_core::Result<()>> {
    let (tx, rx) = mpsc::channel();
    let m = Arc::clone(ml);
    std::thread::spawn(move || {
        let _ = tx.send(m.close());
    });
    rx.recv_timeout(limit).ok()
}

fn assert_timed_out(r: Option<txnstream_core::Result<()>>) {
    match r {
        None => panic!("close() hung on a stalled sync (more than {HANG:?})"),
        Some(Err(Error::Io {
            errno: Some(e),
            context,
            ..
        })) if e == libc::ETIMEDOUT => {
            assert!(context.contains("close_timeout"), "{context}");
        }
        Some(other) => panic!("expected a close timeout, got {other:?}"),
    }
}

/// "a" with 4 entries and cursor "sub" past the first two (durable).
fn ledger_with_a_cursor(
    fs: &Arc<SimFs>,
    inj: &Arc<FaultInjector>,
) -> (Arc<ManagedLedger>, Vec<Position>) {
    let ml = ManagedLedger::open(Path::new(DATA), "a", opts(fs, inj)).unwrap();
    let ps: Vec<Position> = (0..4u8).map(|i| ml.append(&[i]).unwrap()).collect();
    let c = ml.open_cursor("sub").unwrap();
    c.mark_delete(ps[1]).unwrap();
    ml.flush().unwrap();
    (ml, ps)
}

fn reopen_and_check(fs: &Arc<SimFs>, inj: &Arc<FaultInjector>, ps: &[Position]) {
    // Waits for the background shutdown (it finishes now that syncs pass).
    let ml = ManagedLedger::open(Path::new(DATA), "a", opts(fs, inj)).unwrap();
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(ml.read(*p).unwrap(), vec![i as u8], "acknowledged {p}");
    }
    let md = ml.open_cursor("sub").unwrap().mark_delete_position();
    assert!(
        md >= Some(ps[1]),
        "the durable cursor state is kept: {md:?}"
    );
    ml.close().unwrap();
}

#[test]
fn close_with_cursor_changes_returns_a_timeout_when_the_sync_stalls() {
    let fs = Arc::new(SimFs::new());
    let inj = Arc::new(FaultInjector::new());
    let (ml, ps) = ledger_with_a_cursor(&fs, &inj);
    ml.open_cursor("sub").unwrap().mark_delete(ps[2]).unwrap();
    inj.hold(FaultKind::Sync);
    let t0 = Instant::now();
    assert_timed_out(close_within(&ml, HANG));
    println!("close returned after {:?}", t0.elapsed());
    assert!(ml.is_closed());
    assert!(matches!(ml.append(b"x"), Err(Error::LedgerClosed(_))));
    inj.clear();
    reopen_and_check(&fs, &inj, &ps);
}

#[test]
fn the_last_close_returns_a_timeout_when_the_shutdown_stalls() {
    // No cursor: the handle's own close waits for nothing; the store's
    // shutdown waits for the journal (an append held at its sync before it).
    let fs = Arc::new(SimFs::new());
    let inj = Arc::new(FaultInjector::new());
    let ml = ManagedLedger::open(Path::new(DATA), "a", opts(&fs, &inj)).unwrap();
    let ps: Vec<Position> = (0..3u8).map(|i| ml.append(&[i]).unwrap()).collect();
    inj.hold(FaultKind::Sync);
    let (tx, rx) = mpsc::channel();
    ml.append_many_async(
        vec![vec![9]],
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    assert!(inj.wait_held(FaultKind::Sync, HANG));
    assert_timed_out(close_within(&ml, HANG));
    assert!(rx.try_recv().is_err(), "the held append is still in flight");
    inj.clear();
    assert!(rx.recv_timeout(HANG).unwrap().is_ok());
    let again = ManagedLedger::open(Path::new(DATA), "a", opts(&fs, &inj)).unwrap();
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(again.read(*p).unwrap(), vec![i as u8]);
    }
    assert_eq!(again.entry_count(), 4);
    again.close().unwrap();
}

#[test]
fn a_close_that_is_not_the_last_returns_a_timeout_and_the_store_goes_on() {
    let fs = Arc::new(SimFs::new());
    let inj = Arc::new(FaultInjector::new());
    let other = ManagedLedger::open(Path::new(DATA), "other", opts(&fs, &inj)).unwrap();
    let (ml, ps) = ledger_with_a_cursor(&fs, &inj);
    ml.open_cursor("sub").unwrap().mark_delete(ps[3]).unwrap();
    inj.hold(FaultKind::Sync);
    assert_timed_out(close_within(&ml, HANG));
    inj.clear();
    // The directory is still open through the other handle, and works.
    other.append(b"after").unwrap();
    other.close().unwrap();
    drop(other);
    reopen_and_check(&fs, &inj, &ps);
}

#[test]
fn close_timeout_is_validated_by_name() {
    let fs = Arc::new(SimFs::new());
    let inj = Arc::new(FaultInjector::new());
    for bad in [Duration::ZERO, Duration::from_secs(86_401)] {
        let o = LedgerOptions {
            close_timeout: bad,
            ..opts(&fs, &inj)
        };
        match ManagedLedger::open(Path::new(DATA), "a", o) {
            Err(Error::Config { key, .. }) => assert_eq!(key, "close_timeout"),
            other => panic!("close_timeout {bad:?}: {other:?}"),
        }
    }
}
