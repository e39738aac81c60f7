//! The seam between writers and storage.
//!
//! A [`BufferedWriter`](crate) (or anything else that produces entries) writes
//! through an [`EntrySink`]; the managed ledger is the real one. Keeping the
//! seam a trait lets writer tests use failing or slow storage without mocks
//! of the ledger's internals.

use crate::error::Result;
use crate::position::Position;

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
