//! The one error type of the core. `rust/py/src/errors.rs` maps each variant
//! to a class of Python's `txnstream.TxnStreamError` hierarchy, in one place.

use crate::position::Position;
use std::fmt;
use std::io;

/// Result alias used throughout the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the core. `Clone`, so that one failed
/// group commit can fail every waiting caller with the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An entry's bytes cannot be decoded.
    #[error("corrupt entry{}: {reason} at byte offset {offset}", OptPos(*.position))]
    CorruptEntry {
        /// Where the entry lives, when known.
        position: Option<Position>,
        /// Byte offset within the entry where decoding failed.
        offset: usize,
        /// What was wrong.
        reason: String,
    },
    /// A ledger file is damaged before valid data (not a torn tail).
    #[error("corrupt ledger file {path}: {reason} at entry {position} (file offset {offset})")]
    CorruptLedger {
        /// The damaged file.
        path: String,
        /// First entry that could not be read.
        position: Position,
        /// Byte offset in the file.
        offset: u64,
        /// What was wrong.
        reason: String,
    },
    /// An index file (aborted-transaction index, segment offset index) is
    /// damaged or of an unknown version; the caller rebuilds or refetches it.
    #[error("corrupt {kind}: {reason} at byte offset {offset}")]
    CorruptIndex {
        /// Which index.
        kind: String,
        /// Byte offset where the damage was found.
        offset: usize,
        /// What was wrong.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration {key}={value}: {reason}")]
    Config {
        /// The key, under its documented name.
        key: String,
        /// The rejected value as given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A buffered writer was closed before the record was written.
    #[error("buffered writer {0} is closed")]
    WriterClosed(String),
    /// The managed ledger was closed.
    #[error("managed ledger {0} is closed")]
    LedgerClosed(String),
    /// The data directory's storage stopped (a storage thread panicked):
    /// nothing more is written until it is opened again.
    #[error("storage stopped: {0}")]
    Stopped(String),
    /// The managed ledger was opened read-only.
    #[error("managed ledger {0} is open read-only")]
    ReadOnly(String),
    /// No entry at this position (never written, or trimmed).
    #[error("no entry at position {position}: {reason}")]
    PositionNotFound {
        /// The requested position.
        position: Position,
        /// Why there is none.
        reason: String,
    },
    /// A caller passed a value outside the accepted domain.
    #[error("{0}")]
    InvalidArgument(String),
    /// The operating system reported an I/O failure.
    #[error("I/O error while {context}: {message}")]
    Io {
        /// What the core was doing.
        context: String,
        /// `errno`, when the OS gave one.
        errno: Option<i32>,
        /// The OS message.
        message: String,
    },
}

impl Error {
    /// Wraps an `io::Error` with what we were doing when it happened.
    pub fn io(context: impl Into<String>, err: &io::Error) -> Self {
        Error::Io {
            context: context.into(),
            errno: err.raw_os_error(),
            message: err.to_string(),
        }
    }

    /// A `CorruptEntry` without a known position.
    pub fn corrupt_entry(offset: usize, reason: impl Into<String>) -> Self {
        Error::CorruptEntry {
            position: None,
            offset,
            reason: reason.into(),
        }
    }

    /// Attaches the entry's position to a `CorruptEntry`; other errors pass.
    pub fn at(self, pos: Position) -> Self {
        match self {
            Error::CorruptEntry { offset, reason, .. } => Error::CorruptEntry {
                position: Some(pos),
                offset,
                reason,
            },
            other => other,
        }
    }

    /// An `InvalidArgument` naming the bad value.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

struct OptPos(Option<Position>);

impl fmt::Display for OptPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, " at position {p}"),
            None => Ok(()),
        }
    }
}
