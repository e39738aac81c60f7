//! Fault injection for tests: make the next N writes, syncs or
//! preallocations fail with a chosen `errno`, exactly where a real disk
//! failure (EIO, ENOSPC) would surface.

use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

impl FaultKind {
    /// Parses `"write"`, `"sync"` or `"preallocate"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "write" => Some(Self::Write),
            "sync" => Some(Self::Sync),
            "preallocate" => Some(Self::Preallocate),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Armed {
    kind: FaultKind,
    errno: i32,
    remaining: u32,
}

/// Armed faults, shared by a ledger and the test that arms them.
#[derive(Debug, Default)]
pub struct FaultInjector {
    any: AtomicBool,
    armed: Mutex<Vec<Armed>>,
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
        });
        self.any.store(true, Ordering::Release);
    }

    /// Disarms everything.
    pub fn clear(&self) {
        self.armed.lock().clear();
        self.any.store(false, Ordering::Release);
    }

    /// Returns the injected error if a fault of `kind` is armed.
    pub(crate) fn check(&self, kind: FaultKind) -> io::Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut armed = self.armed.lock();
        let hit = armed
            .iter_mut()
            .find(|a| a.kind == kind && a.remaining > 0)
            .map(|a| {
                a.remaining -= 1;
                a.errno
            });
        armed.retain(|a| a.remaining > 0);
        if armed.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        match hit {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}
