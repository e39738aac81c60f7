//! Fault injection for tests: make the next N writes, syncs, reads or
//! preallocations fail with a chosen `errno`, exactly where a real disk
//! failure (EIO, ENOSPC) would surface; or hold every call of a kind at a
//! gate until released, to observe what happens while, say, a sync is
//! still in progress.

use crate::sync::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Which storage call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The data write: half of the batch reaches the file, then the error
    /// (a short write followed by a failure, the nastiest case).
    Write,
    /// The `fdatasync` after a complete write.
    Sync,
    /// `fallocate` of a segment's reserved space (disk full at rollover).
    Preallocate,
    /// A read of entries (by position, range or cursor).
    Read,
    /// A write of the data directory's CATALOG (at a checkpoint).
    Meta,
    /// A checkpoint between its two reads of the directory's state (the
    /// ledgers it lists and the next ledger id): a gate for races with
    /// ledgers created meanwhile.
    Checkpoint,
}

impl FaultKind {
    /// Parses `"write"`, `"sync"`, `"preallocate"`, `"read"`, `"meta"` or `"checkpoint"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "write" => Some(Self::Write),
            "sync" => Some(Self::Sync),
            "preallocate" => Some(Self::Preallocate),
            "read" => Some(Self::Read),
            "meta" => Some(Self::Meta),
            "checkpoint" => Some(Self::Checkpoint),
            _ => None,
        }
    }
}

/// A gate on one kind of call: while closed, calls wait at it.
#[derive(Debug, Default)]
struct Gate {
    closed: bool,
    /// Calls waiting at the gate now.
    waiting: usize,
}

#[derive(Debug)]
struct Armed {
    kind: FaultKind,
    errno: i32,
    remaining: u32,
    /// Panic instead of failing (only armed by tests: `testing` feature).
    panic: bool,
}

/// Armed faults, shared by a ledger and the test that arms them.
#[derive(Debug, Default)]
pub struct FaultInjector {
    any: AtomicBool,
    armed: Mutex<Vec<Armed>>,
    gates: Mutex<HashMap<FaultKind, Gate>>,
    gates_cv: Condvar,
}

impl FaultInjector {
    /// A new injector with nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `times` calls of `kind` fail with `errno`.
    pub fn inject(&self, kind: FaultKind, errno: i32, times: u32) {
        let mut armed = self.armed.lock();
        armed.push(Armed {
            kind,
            errno,
            remaining: times,
            panic: false,
        });
        self.any.store(true, Ordering::Release);
    }

    /// Makes the next call of `kind` panic, on whichever storage thread
    /// makes it: a bug's worst case, to check that no caller then waits
    /// forever.
    #[cfg(any(test, feature = "testing"))]
    pub fn inject_panic(&self, kind: FaultKind) {
        self.armed.lock().push(Armed {
            kind,
            errno: 0,
            remaining: 1,
            panic: true,
        });
        self.any.store(true, Ordering::Release);
    }

    /// Disarms every injected error and opens every gate.
    pub fn clear(&self) {
        self.armed.lock().clear();
        self.gates.lock().clear();
        self.gates_cv.notify_all();
        self.any.store(false, Ordering::Release);
    }

    /// Closes the gate of `kind`: every later call of it waits until
    /// [`release`](Self::release).
    pub fn hold(&self, kind: FaultKind) {
        self.gates.lock().entry(kind).or_default().closed = true;
        self.any.store(true, Ordering::Release);
    }

    /// Opens the gate of `kind`, letting waiting calls go on.
    pub fn release(&self, kind: FaultKind) {
        if let Some(g) = self.gates.lock().get_mut(&kind) {
            g.closed = false;
        }
        self.gates_cv.notify_all();
    }

    /// Waits until a call of `kind` is held at its gate; false on timeout.
    pub fn wait_held(&self, kind: FaultKind, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut gates = self.gates.lock();
        loop {
            if gates.get(&kind).is_some_and(|g| g.waiting > 0) {
                return true;
            }
            if self.gates_cv.wait_until(&mut gates, deadline).timed_out() {
                return gates.get(&kind).is_some_and(|g| g.waiting > 0);
            }
        }
    }

    fn pass_gate(&self, kind: FaultKind) {
        let mut gates = self.gates.lock();
        let Some(g) = gates.get_mut(&kind) else {
            return;
        };
        if !g.closed {
            return;
        }
        g.waiting += 1;
        self.gates_cv.notify_all();
        while gates.get(&kind).is_some_and(|g| g.closed) {
            self.gates_cv.wait(&mut gates);
        }
        if let Some(g) = gates.get_mut(&kind) {
            g.waiting -= 1;
        }
    }

    /// Waits at the gate of `kind` if it is closed, then returns the
    /// injected error if a fault of `kind` is armed.
    pub(crate) fn check(&self, kind: FaultKind) -> io::Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        self.pass_gate(kind);
        let mut armed = self.armed.lock();
        let hit = armed
            .iter_mut()
            .find(|a| a.kind == kind && a.remaining > 0)
            .map(|a| {
                a.remaining -= 1;
                (a.errno, a.panic)
            });
        armed.retain(|a| a.remaining > 0);
        if armed.is_empty()
            && self
                .gates
                .lock()
                .values()
                .all(|g| !g.closed && g.waiting == 0)
        {
            self.any.store(false, Ordering::Release);
        }
        drop(armed);
        match hit {
            Some((_, true)) => panic!("injected panic at {kind:?}"),
            Some((errno, false)) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}
