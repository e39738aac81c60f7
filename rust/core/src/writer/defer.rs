//! Completions that storage runs *inline* are deferred until the writer has
//! released its lock.
//!
//! `EntrySink::append_async` normally completes later on a storage thread,
//! but a sink may fail an entry synchronously (closed ledger, bad input).
//! The writer calls `append_async` under its lock, so a user callback run
//! there that writes again would deadlock. Every writer operation opens a
//! [`Scope`]; completions arriving while one is open on this thread are
//! queued and run when the outermost scope closes, after the lock is gone.

use std::cell::RefCell;
use std::collections::VecDeque;

type Job = Box<dyn FnOnce()>;

#[derive(Default)]
struct Deferred {
    depth: u32,
    jobs: VecDeque<Job>,
}

thread_local! {
    static DEFERRED: RefCell<Deferred> = RefCell::new(Deferred::default());
}

/// Marks this thread as inside a writer operation. Declare it BEFORE the
/// lock guard so that it drops after it.
pub(crate) struct Scope(());

impl Scope {
    pub(crate) fn enter() -> Self {
        DEFERRED.with(|d| d.borrow_mut().depth += 1);
        Scope(())
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let outermost = DEFERRED.with(|d| {
            let mut d = d.borrow_mut();
            d.depth -= 1;
            d.depth == 0
        });
        if !outermost {
            return;
        }
        // Drain with the depth held at 1: completions deferred by the jobs
        // themselves (a callback that writes again) queue BEHIND the rest,
        // so records still complete in submission order.
        let _draining = Draining::enter();
        while let Some(job) = DEFERRED.with(|d| d.borrow_mut().jobs.pop_front()) {
            job();
        }
    }
}

/// Holds the depth at 1 while draining; resets it even if a job panics.
struct Draining;

impl Draining {
    fn enter() -> Self {
        DEFERRED.with(|d| d.borrow_mut().depth = 1);
        Draining
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        DEFERRED.with(|d| d.borrow_mut().depth = 0);
    }
}

/// Runs `f` now, or after the current scope if this thread is inside one.
pub(crate) fn run_or_defer<F: FnOnce() + 'static>(f: F) {
    let deferred = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        if d.depth > 0 {
            d.jobs.push_back(Box::new(f));
            None
        } else {
            Some(f)
        }
    });
    if let Some(f) = deferred {
        f();
    }
}
