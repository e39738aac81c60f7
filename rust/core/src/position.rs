//! Entry addresses inside a managed ledger.

use std::fmt;

/// Address of one entry: `(ledger_id, entry_id)`, totally ordered.
///
/// Batch fields live in [`TxnPosition`]; ordering and equality of plain
/// positions never look at them (as Pulsar does), so positions are map keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// Ledger (segment file) id within the managed ledger.
    pub ledger_id: u64,
    /// Entry id within the ledger, counted from 0.
    pub entry_id: u64,
}

impl Position {
    /// Builds a position.
    pub const fn new(ledger_id: u64, entry_id: u64) -> Self {
        Self {
            ledger_id,
            entry_id,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}

/// A record's address: the entry plus its place inside a batched entry.
/// An unbatched record has `batch_size == 1, batch_index == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TxnPosition {
    /// The entry holding the record.
    pub position: Position,
    /// Number of records in that entry.
    pub batch_size: u32,
    /// Index of the record within the entry.
    pub batch_index: u32,
}

impl TxnPosition {
    /// A record that is alone in its entry.
    pub const fn single(position: Position) -> Self {
        Self {
            position,
            batch_size: 1,
            batch_index: 0,
        }
    }
}
