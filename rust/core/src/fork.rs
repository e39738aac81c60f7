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
//! - Locks are `std::sync`'s (see [`crate::sync`]): their state is in the
//!   lock itself, so a child that touches only objects made after the fork
//!   never meets a thread of its parent (parking_lot's shared table of
//!   parked threads did: SIGSEGV or a hang in the child).

use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

/// Descriptors holding a data directory's writer lock (an OFD lock).
/// Slots hold -1 when free; lock-free so the child handler may read them.
const LOCK_SLOTS: usize = 256;
static LOCK_FDS: [AtomicI32; LOCK_SLOTS] = [const { AtomicI32::new(-1) }; LOCK_SLOTS];

/// Remembers `fd` as holding a writer lock, so a forked child lets go of
/// it (see [`child`]); returns its slot for [`forget_lock_fd`] (None: the
/// table is full, and a child then keeps the lock while it lives).
pub fn remember_lock_fd(fd: i32) -> Option<usize> {
    LOCK_FDS.iter().position(|slot| {
        slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// The lock of `slot` is released (its descriptor is about to close).
pub fn forget_lock_fd(slot: usize) {
    if let Some(s) = LOCK_FDS.get(slot) {
        s.store(-1, Ordering::Release);
    }
}

/// In a child: point every writer-lock descriptor at `/dev/null`. An OFD
/// lock belongs to the open file description, which the child would
/// otherwise share: the parent could not reopen its own directory after
/// closing it while any forked worker lived. The descriptor numbers stay
/// valid (whoever owns them closes `/dev/null` later), and `open`, `dup2`
/// and `close` are async-signal-safe.
fn release_inherited_locks() {
    // SAFETY: a NUL-terminated path literal.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for slot in &LOCK_FDS {
        let fd = slot.load(Ordering::Acquire);
        if fd >= 0 {
            // SAFETY: both are descriptors of this process; dup2 atomically
            // replaces `fd`'s file description (dropping the lock's) with
            // /dev/null's.
            unsafe { libc::dup2(null, fd) };
        }
    }
    // SAFETY: `null` was opened above and is used by nothing else.
    unsafe { libc::close(null) };
}

static GENERATION: AtomicU64 = AtomicU64::new(0);
static GATE: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();

thread_local! {
    /// The gate, held by the forking thread from `prepare` until `parent`
    /// or `child` (both run on that thread).
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

fn lock_gate() -> MutexGuard<'static, ()> {
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

extern "C" fn prepare() {
    // Held across fork(): released by `parent` and `child`.
    let g = lock_gate();
    HELD.with(|h| *h.borrow_mut() = Some(g));
}

fn release_gate() {
    // Dropping the guard unlocks: a futex word store (and a wake only if
    // someone waits, which in a child nobody can).
    HELD.with(|h| drop(h.borrow_mut().take()));
}

extern "C" fn parent() {
    release_gate();
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    release_inherited_locks();
    release_gate();
}

/// Registers the fork handlers (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the handlers are plain `extern "C"` functions that never
        // unwind. They touch only state this module owns: an atomic, a lock
        // (taken in `prepare`, released on the same thread in `parent` or
        // `child`) kept in a thread-local of the forking thread, and, in the
        // child, the writer-lock descriptors (`open`/`dup2`/`close`, which
        // are async-signal-safe). Registering them has no other effect.
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
    lock_gate()
}
