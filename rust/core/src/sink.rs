//! The seam between writers and storage.
//!
//! A [`BufferedWriter`](crate) (or anything else that produces entries) writes
//! through an [`EntrySink`]; the managed ledger is the real one. Keeping the
//! seam a trait lets writer tests use failing or slow storage without mocks
//! of the ledger's internals.

use crate::error::Result;
use crate::position::Position;
use std::cell::Cell;

thread_local! {
    /// Set on threads that serve many sinks (the writers' timer): an append
    /// there never waits for room, or one full directory would hold up the
    /// others. They look at [`EntrySink::has_room`] first, so at most the
    /// entry that raced another caller for the last room goes over the limit.
    static NEVER_WAITS_FOR_ROOM: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as one whose appends never wait for room.
pub(crate) fn never_wait_for_room() {
    NEVER_WAITS_FOR_ROOM.with(|c| c.set(true));
}

/// False on a thread marked by [`never_wait_for_room`].
pub(crate) fn may_wait_for_room() -> bool {
    !NEVER_WAITS_FOR_ROOM.with(Cell::get)
}

/// Called once an appended entry is durable (fsynced) or has failed.
pub type AppendCallback = Box<dyn FnOnce(Result<Position>) + Send + 'static>;

/// Durable, ordered storage of entries.
pub trait EntrySink: Send + Sync + 'static {
    /// Queues `entry` for appending. `done` runs exactly once, after the entry
    /// is durable or has failed, on a storage thread: it must not block.
    /// Entries are stored, and callbacks run, in call order.
    fn append_async(&self, entry: Vec<u8>, done: AppendCallback);

    /// Name of the log, for errors and metrics.
    fn name(&self) -> &str;

    /// True if an entry of `bytes` would be queued without waiting for room
    /// (backpressure). A hint for callers deciding whether to release the GIL.
    fn has_room(&self, bytes: usize) -> bool {
        let _ = bytes;
        true
    }
}
