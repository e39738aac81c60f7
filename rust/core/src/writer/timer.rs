//! The `max_delay` timer: one process-wide thread serving every writer.
//!
//! A writer keeps at most ONE pending deadline here (it re-arms only when
//! the previous one has fired), so a slow flusher can never make timer work
//! pile up; and writers hold no thread of their own, so thousands of
//! pending-ack logs cost nothing while idle.

use crate::error::{Error, Result};
use crate::fork;
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::panic::AssertUnwindSafe;
use std::sync::Weak;
use std::thread;
use std::time::Instant;

/// Something woken at a deadline.
pub(crate) trait Timed: Send + Sync {
    /// Runs on the timer thread; must not block for long.
    fn on_timer(&self);
}

struct Slot {
    at: Instant,
    seq: u64,
    target: Weak<dyn Timed>,
}

impl PartialEq for Slot {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Slot {}
impl PartialOrd for Slot {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Slot {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Default)]
struct Heap {
    slots: BinaryHeap<Reverse<Slot>>,
    seq: u64,
}

pub(crate) struct Scheduler {
    heap: Mutex<Heap>,
    wake: Condvar,
}

/// The scheduler of the current fork generation (a forked child has no
/// timer thread: it gets a new scheduler, see [`crate::fork`]).
static SCHEDULER: Mutex<Option<(u64, &'static Scheduler)>> = Mutex::new(None);

/// The shared scheduler, starting its thread on first use (in this
/// process).
pub(crate) fn scheduler() -> Result<&'static Scheduler> {
    let gen = fork::generation();
    let _gate = fork::gate();
    let mut cur = SCHEDULER.lock();
    if let Some((g, s)) = *cur {
        if g == gen {
            return Ok(s);
        }
    }
    // One per generation, living for the rest of the process (the parent's
    // is left untouched: its lock may have been held at the fork).
    let s: &'static Scheduler = Box::leak(Box::new(Scheduler {
        heap: Mutex::new(Heap::default()),
        wake: Condvar::new(),
    }));
    thread::Builder::new()
        .name("txnstream-writer-timer".into())
        .spawn(move || {
            crate::sink::never_wait_for_room();
            s.run();
        })
        .map_err(|e| Error::io("starting the buffered-writer timer thread", &e))?;
    *cur = Some((gen, s));
    Ok(s)
}

impl Scheduler {
    /// Wakes `target` at `at` (or soon after). Dropped targets are skipped.
    pub(crate) fn schedule(&self, at: Instant, target: Weak<dyn Timed>) {
        let mut h = self.heap.lock();
        h.seq += 1;
        let seq = h.seq;
        let earliest = h.slots.peek().is_none_or(|Reverse(s)| at < s.at);
        h.slots.push(Reverse(Slot { at, seq, target }));
        drop(h);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        let mut h = self.heap.lock();
        loop {
            let next = h.slots.peek().map(|Reverse(s)| s.at);
            match next {
                None => self.wake.wait(&mut h),
                Some(at) if at <= Instant::now() => {
                    if let Some(Reverse(slot)) = h.slots.pop() {
                        MutexGuard::unlocked(&mut h, || {
                            if let Some(t) = slot.target.upgrade() {
                                // One writer's panic must not stop the timer
                                // every writer of the process relies on.
                                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| t.on_timer()));
                            }
                        });
                    }
                }
                Some(at) => {
                    self.wake.wait_until(&mut h, at);
                }
            }
        }
    }
}
