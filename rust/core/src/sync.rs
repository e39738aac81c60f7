//! Locks that survive `fork()`: `std::sync` in the shape the code uses.
//!
//! We used parking_lot, which keeps ONE process-wide table of parked
//! threads: each bucket has a word lock and a linked list of the
//! `ThreadData` of the threads parked on keys hashing there. A forked child
//! inherits that table with the entries of every parent thread that was
//! parked at the fork (our flushers, journal writers and timer nearly
//! always are), and with any bucket lock one of them held. Those threads do
//! not exist in the child: glibc hands their stacks, and frees their
//! thread-local blocks, to the child's new threads. The child's first park
//! or wake on a key of such a bucket then follows a stale pointer (SIGSEGV:
//! the CI run of stop 20) or waits for a bucket lock nobody will release (a
//! hang: reproduced with 80 busy parent directories), however carefully
//! our own objects are made again per fork generation (see
//! [`crate::fork`]). This is parking_lot#515.
//!
//! `std::sync` on Linux keeps all of a lock's or condition variable's state
//! in its own futex word: nothing is shared between unrelated locks, so a
//! child that touches only objects made after the fork cannot meet a dead
//! parent thread. These wrappers keep parking_lot's call shape (guards
//! without `Result`, `Condvar::wait(&mut guard)`, deadlines as `Instant`)
//! and ignore poisoning, as parking_lot did: a panic while a lock is held
//! is a bug reported where it happens (the storage threads catch and report
//! theirs), and the data behind the lock is still used.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// A mutual-exclusion lock (`std::sync::Mutex` without poisoning).
#[derive(Default, Debug)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// The guard of a locked [`Mutex`]; unlocks when dropped.
///
/// The inner guard is `None` only while [`Condvar`] waits or
/// [`MutexGuard::unlocked`] runs its closure, both of which hold `&mut`
/// to the guard, so no `Deref` can observe it.
pub struct MutexGuard<'a, T: ?Sized> {
    lock: &'a Mutex<T>,
    inner: Option<std::sync::MutexGuard<'a, T>>,
}

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    /// The value (no lock needed: the mutex is consumed).
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, blocking until the lock is free.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            lock: self,
            inner: Some(self.raw_lock()),
        }
    }

    /// Locks if the lock is free now; `None` if another thread holds it.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let inner = match self.0.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(MutexGuard {
            lock: self,
            inner: Some(inner),
        })
    }

    /// The value through `&mut` (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    fn raw_lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// Runs `f` with the lock released, then locks again.
    pub fn unlocked<R>(g: &mut Self, f: impl FnOnce() -> R) -> R {
        drop(g.inner.take());
        // Relocks even if `f` panics, so the guard stays valid.
        struct Relock<'g, 'a, T: ?Sized>(&'g mut MutexGuard<'a, T>);
        impl<T: ?Sized> Drop for Relock<'_, '_, T> {
            fn drop(&mut self) {
                self.0.inner = Some(self.0.lock.raw_lock());
            }
        }
        let _relock = Relock(g);
        f()
    }

    fn held(&self) -> &std::sync::MutexGuard<'a, T> {
        match &self.inner {
            Some(g) => g,
            None => unreachable!("a MutexGuard is only empty inside a wait"),
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.held()
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.inner {
            Some(g) => g,
            None => unreachable!("a MutexGuard is only empty inside a wait"),
        }
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// Whether a timed wait returned because its time was up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True if the wait ended at its deadline (not by a notification).
    pub fn timed_out(self) -> bool {
        self.0
    }
}

/// A condition variable (`std::sync::Condvar`, parking_lot's call shape).
///
/// std's futex condition variable makes a `futex` wake system call on every
/// notify, waiters or not; ours are notified far more often than waited on
/// (every published append, every flush), so it counts its waiters and
/// skips the call when there are none, as parking_lot did. This is sound
/// for the way condition variables are used: a waiter registers while it
/// holds the mutex, before it sleeps, and a notifier changes the state it
/// signals under that mutex, so it either sees the registration or the
/// waiter sees the new state before deciding to wait.
#[derive(Default, Debug)]
pub struct Condvar {
    cv: std::sync::Condvar,
    waiters: AtomicUsize,
}

impl Condvar {
    /// A new condition variable.
    pub const fn new() -> Self {
        Condvar {
            cv: std::sync::Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_one();
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Releases `g`'s lock, waits for a notification (or a spurious
    /// wake-up), and locks again.
    pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
        if let Some(inner) = g.inner.take() {
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let inner = self.cv.wait(inner).unwrap_or_else(PoisonError::into_inner);
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            g.inner = Some(inner);
        }
    }

    /// As [`Condvar::wait`], for at most `timeout`.
    pub fn wait_for<T>(&self, g: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
        let Some(inner) = g.inner.take() else {
            return WaitTimeoutResult(true);
        };
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let (inner, r) = self
            .cv
            .wait_timeout(inner, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        g.inner = Some(inner);
        WaitTimeoutResult(r.timed_out())
    }

    /// As [`Condvar::wait`], until `deadline` at the latest.
    pub fn wait_until<T>(&self, g: &mut MutexGuard<'_, T>, deadline: Instant) -> WaitTimeoutResult {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return WaitTimeoutResult(true);
        }
        self.wait_for(g, left)
    }
}

/// A reader-writer lock (`std::sync::RwLock` without poisoning).
#[derive(Default, Debug)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    /// A new unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, blocking while a writer holds the lock.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shared access by `deadline` (polling while a writer holds the lock;
    /// `None`: wait as long as it takes); `None` if the deadline passed.
    pub fn read_by(&self, deadline: Option<Instant>) -> Option<std::sync::RwLockReadGuard<'_, T>> {
        let Some(deadline) = deadline else {
            return Some(self.read());
        };
        loop {
            match self.0.try_read() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
        }
    }

    /// Exclusive access, blocking while anyone holds the lock.
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value through `&mut` (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_condvar_wait_releases_the_lock_and_takes_it_back() {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p2 = Arc::clone(&pair);
        let t = std::thread::spawn(move || {
            let mut g = p2.0.lock();
            *g = 1;
            p2.1.notify_all();
        });
        let mut g = pair.0.lock();
        while *g == 0 {
            pair.1.wait(&mut g);
        }
        assert_eq!(*g, 1);
        drop(g);
        t.join().ok();
    }

    /// Takes the turns `first`, `first + 2`, ... below `end` of a count
    /// two threads advance in turn. A lost notify fails (a turn waits 10 s
    /// at most) instead of hanging.
    fn take_turns(pair: &(Mutex<u64>, Condvar), first: u64, end: u64, all: bool) {
        for turn in (first..end).step_by(2) {
            let mut g = pair.0.lock();
            while *g != turn {
                let r = pair.1.wait_for(&mut g, Duration::from_secs(10));
                assert!(!r.timed_out(), "a notify was lost at turn {turn}");
            }
            *g += 1;
            drop(g);
            if all {
                pair.1.notify_all();
            } else {
                pair.1.notify_one();
            }
        }
    }

    #[test]
    fn a_notify_reaches_a_waiter_that_registered_before_it() {
        // Many rounds of the hand-over the waiter count must not lose.
        let pair = Arc::new((Mutex::new(0u64), Condvar::new()));
        let p2 = Arc::clone(&pair);
        let t = std::thread::spawn(move || take_turns(&p2, 1, 40_000, true));
        take_turns(&pair, 0, 40_000, false);
        assert!(t.join().is_ok());
        assert_eq!(*pair.0.lock(), 40_000);
    }

    #[test]
    fn timed_waits_report_their_deadline() {
        let m = Mutex::new(());
        let cv = Condvar::new();
        let mut g = m.lock();
        assert!(cv.wait_for(&mut g, Duration::from_millis(1)).timed_out());
        let past = Instant::now();
        assert!(cv.wait_until(&mut g, past).timed_out());
        // The guard still holds the lock after the waits.
        assert!(m.0.try_lock().is_err());
    }

    #[test]
    fn unlocked_releases_the_lock_for_its_closure_only() {
        let m = Mutex::new(5);
        let mut g = m.lock();
        let inside = MutexGuard::unlocked(&mut g, || *m.lock() + 1);
        assert_eq!(inside, 6);
        assert!(m.0.try_lock().is_err());
        *g = 7;
        drop(g);
        assert_eq!(m.into_inner(), 7);
    }

    #[test]
    fn a_panic_under_the_lock_does_not_poison_it() {
        let m = Arc::new(Mutex::new(1));
        let m2 = Arc::clone(&m);
        let r = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("a bug while holding the lock");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*m.lock(), 1);
    }
}
