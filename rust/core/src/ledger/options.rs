//! Tuning knobs: per managed ledger (rollover) and per data directory (the
//! journal, checkpoints, bounds), both given to
//! [`ManagedLedger::open`](super::ManagedLedger::open).
//!
//! Data-directory settings are fixed by the first open of the directory in
//! a process; a later open that asks for a different non-default value gets
//! a `Config` error naming the setting, never a silent mismatch.

use super::fault::FaultInjector;
use super::fs::Fs;
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
    /// Open without the writer lock: no recovery, no writes; another
    /// process may keep appending ([`ManagedLedger::refresh`](super::ManagedLedger::refresh)
    /// picks up what it wrote).
    pub read_only: bool,
    /// Data directory: bytes reserved with `fallocate` ahead of the journal's
    /// write offset, so a sync need not also commit a growing file size
    /// (0 disables; a disk too full to reserve simply goes without).
    pub preallocate_bytes: u64,
    /// Data directory: how long cursor changes may stay in memory before the
    /// flusher journals them (they are also written on `flush()`/`close()`).
    pub cursor_flush_interval: Duration,
    /// Data directory: most payload bytes one group commit writes.
    pub max_batch_bytes: usize,
    /// Data directory: a journal segment is sealed after this many bytes.
    pub journal_segment_bytes: u64,
    /// Data directory: a checkpoint runs once the journal grew this much.
    pub checkpoint_bytes: u64,
    /// Data directory: ... or once this much time passed with changes.
    pub checkpoint_interval: Duration,
    /// Data directory: appends not yet durable may hold this many bytes;
    /// beyond, appends wait (backpressure) up to `append_timeout`.
    pub max_pending_bytes: u64,
    /// Data directory: the longest an append waits for queue space.
    pub append_timeout: Duration,
    /// Data directory: the longest `close()` waits for the final cursor
    /// states and (last handle) the store's shutdown to be durable. On a disk
    /// that stops answering it then fails with an `Io` error of errno
    /// `ETIMEDOUT`; the shutdown goes on in the background, and whatever it
    /// did not finish is recovered from the files at the next open.
    pub close_timeout: Duration,
    /// Data directory: entries of at least this many bytes are written once,
    /// straight into their ledger file (synced with the group, a small
    /// reference in the journal), instead of into the journal and again
    /// behind it (0: never).
    pub direct_entry_bytes: usize,
    /// Data directory: ledger files kept open (two descriptors per ledger).
    pub max_open_files: usize,
    /// Data directory: storage threads, whatever the number of ledgers: 3
    /// (journal writer, journal sync pipelined with it, flusher) or 2 (the
    /// writer syncs its groups itself: fewer threads, no pipelining).
    pub storage_threads: usize,
    /// Data directory, test hook: makes writes, syncs, reads or
    /// preallocation fail on demand.
    pub fault_injector: Option<Arc<FaultInjector>>,
    /// Data directory: the file system (the real one by default; tests use
    /// a simulated one that can lose power).
    pub fs: Option<Arc<dyn Fs>>,
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
            journal_segment_bytes: 64 << 20,
            checkpoint_bytes: 64 << 20,
            checkpoint_interval: Duration::from_secs(10),
            max_pending_bytes: 256 << 20,
            append_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(30),
            direct_entry_bytes: 64 << 10,
            max_open_files: 128,
            storage_threads: 3,
            fault_injector: None,
            fs: None,
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
        if self.journal_segment_bytes < 4096 || self.journal_segment_bytes > 1 << 40 {
            return Err(bad(
                "journal_segment_bytes",
                self.journal_segment_bytes,
                "must be in 4096..=2**40",
            ));
        }
        if self.checkpoint_bytes < 4096 {
            return Err(bad(
                "checkpoint_bytes",
                self.checkpoint_bytes,
                "must be >= 4096",
            ));
        }
        if self.checkpoint_interval < Duration::from_millis(1)
            || self.checkpoint_interval > Duration::from_secs(86_400)
        {
            return Err(bad(
                "checkpoint_interval",
                format!("{:?}", self.checkpoint_interval),
                "must be between 1 ms and 1 day",
            ));
        }
        if self.max_pending_bytes < 1 << 20 {
            return Err(bad(
                "max_pending_bytes",
                self.max_pending_bytes,
                "must be >= 1 MiB",
            ));
        }
        if self.append_timeout > Duration::from_secs(86_400) {
            return Err(bad(
                "append_timeout",
                format!("{:?}", self.append_timeout),
                "must be <= 1 day",
            ));
        }
        if self.close_timeout < Duration::from_millis(1)
            || self.close_timeout > Duration::from_secs(86_400)
        {
            return Err(bad(
                "close_timeout",
                format!("{:?}", self.close_timeout),
                "must be between 1 ms and 1 day",
            ));
        }
        if !(2..=3).contains(&self.storage_threads) {
            return Err(bad(
                "storage_threads",
                self.storage_threads,
                "must be 2 or 3",
            ));
        }
        if !(8..=65_536).contains(&self.max_open_files) {
            return Err(bad(
                "max_open_files",
                self.max_open_files,
                "must be in 8..=65536",
            ));
        }
        Ok(())
    }

    /// The first data-directory setting of `self` that is not the default
    /// and differs from `open` (the settings a directory is open with).
    pub(crate) fn conflict_with(&self, open: &LedgerOptions) -> Option<Error> {
        let d = LedgerOptions::default();
        macro_rules! check {
            ($field:ident) => {
                if self.$field != d.$field && self.$field != open.$field {
                    return Some(bad(
                        stringify!($field),
                        format!("{:?}", self.$field),
                        &format!(
                            "the data directory is already open in this process with {:?} \
                             (data-directory settings are fixed by its first open)",
                            open.$field
                        ),
                    ));
                }
            };
        }
        check!(preallocate_bytes);
        check!(cursor_flush_interval);
        check!(max_batch_bytes);
        check!(journal_segment_bytes);
        check!(checkpoint_bytes);
        check!(checkpoint_interval);
        check!(max_pending_bytes);
        check!(append_timeout);
        check!(close_timeout);
        check!(max_open_files);
        check!(direct_entry_bytes);
        check!(storage_threads);
        if let Some(f) = &self.fault_injector {
            if !open
                .fault_injector
                .as_ref()
                .is_some_and(|o| Arc::ptr_eq(o, f))
            {
                return Some(bad(
                    "fault_injector",
                    "given",
                    "the data directory is already open with another fault injector",
                ));
            }
        }
        None
    }
}
