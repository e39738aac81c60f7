//! Living with `fork()`.
//!
//! A child process has one thread: every storage thread, the writer timer
//! and the bindings' completion thread of the parent are gone, and any lock
//! another thread held at the fork stays locked forever. So:
//!
//! - [`generation`] counts forks (a `pthread_atfork` child handler bumps
//!   it). Objects remember the generation they were made in; used in a
//!   later one they fail fast ("opened before fork()") instead of waiting
//!   for a thread that does not exist, and their destructors do nothing.
//! - Process-wide singletons (the data-directory registry, the timer, the
//!   completion thread) are made again, per generation, on first use.
//! - [`gate`] is a process-wide lock held around every short critical
//!   section that touches such singletons; the fork handlers hold it across
//!   `fork()` so the child never inherits it (or them) mid-update.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static GATE: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();

extern "C" fn prepare() {
    // Held across fork(): released by `parent` and `child`.
    std::mem::forget(GATE.lock());
}

extern "C" fn parent() {
    // SAFETY: `prepare` locked GATE on this thread and forgot the guard; we
    // release exactly that lock.
    unsafe { GATE.force_unlock() };
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // SAFETY: as in `parent`: the forking thread (now the child's only
    // thread) took the lock in `prepare`.
    unsafe { GATE.force_unlock() };
}

/// Registers the fork handlers (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the handlers are plain `extern "C"` functions that touch
        // only an atomic and a lock this module owns; registering them has
        // no other effect.
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        }
    });
}

/// How many times this process's ancestors forked into it.
pub fn generation() -> u64 {
    install();
    GENERATION.load(Ordering::Acquire)
}

/// The process-wide gate (see the module docs). Hold it only briefly.
pub fn gate() -> MutexGuard<'static, ()> {
    install();
    GATE.lock()
}
