//! Tuning knobs of a managed ledger.

use super::fault::FaultInjector;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// Largest payload one entry may carry (the record length is a `u32`, and a
/// bound keeps a corrupt length from asking for gigabytes).
pub const MAX_ENTRY_SIZE: usize = 256 << 20;

/// Options of [`ManagedLedger::open`](super::ManagedLedger::open).
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Roll over to a new ledger after this many entries (checked between
    /// appends, so one `append_many` is never split across ledgers).
    pub max_entries_per_ledger: u64,
    /// Roll over to a new ledger once it holds this many bytes.
    pub max_bytes_per_ledger: u64,
    /// Open without the writer lock: no recovery truncation, no writes; other
    /// processes may keep appending ([`ManagedLedger::refresh`](super::ManagedLedger::refresh)
    /// picks up what they wrote).
    pub read_only: bool,
    /// Bytes reserved with `fallocate` ahead of the write offset, so a sync
    /// does not also have to commit a growing file size (0 disables).
    pub preallocate_bytes: u64,
    /// How long cursor changes may stay in memory before the background
    /// flush writes META (they are also written on `flush()` and `close()`).
    pub cursor_flush_interval: Duration,
    /// Largest number of payload bytes one group commit writes before syncing.
    pub max_batch_bytes: usize,
    /// Test hook: makes writes, syncs or preallocation fail on demand.
    pub fault_injector: Option<Arc<FaultInjector>>,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        Self {
            max_entries_per_ledger: 50_000,
            max_bytes_per_ledger: 256 << 20,
            read_only: false,
            preallocate_bytes: 16 << 20,
            cursor_flush_interval: Duration::from_millis(100),
            max_batch_bytes: 8 << 20,
            fault_injector: None,
        }
    }
}

fn bad(key: &str, value: impl ToString, reason: &str) -> Error {
    Error::Config {
        key: key.to_owned(),
        value: value.to_string(),
        reason: reason.to_owned(),
    }
}

impl LedgerOptions {
    /// Rejects values that cannot work, naming the option.
    pub fn validate(&self) -> Result<()> {
        if self.max_entries_per_ledger == 0 {
            return Err(bad("max_entries_per_ledger", 0, "must be >= 1"));
        }
        if self.max_bytes_per_ledger < 1024 {
            return Err(bad(
                "max_bytes_per_ledger",
                self.max_bytes_per_ledger,
                "must be >= 1024",
            ));
        }
        if self.preallocate_bytes > 1 << 32 {
            return Err(bad(
                "preallocate_bytes",
                self.preallocate_bytes,
                "must be <= 4 GiB",
            ));
        }
        if self.cursor_flush_interval > Duration::from_secs(3600) {
            return Err(bad(
                "cursor_flush_interval",
                format!("{:?}", self.cursor_flush_interval),
                "must be <= 1 hour",
            ));
        }
        if self.max_batch_bytes == 0 {
            return Err(bad("max_batch_bytes", 0, "must be >= 1"));
        }
        Ok(())
    }
}
