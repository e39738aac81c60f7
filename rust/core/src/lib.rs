//! txnstream core: the pure-Rust half of txnstream (no Python here).
//!
//! - [`frame`]: PIP-160 batched-entry framing.
//! - [`ackset`]: batch-index ack sets, Java `BitSet` compatible.
//! - [`demux`]: the shared snapshot reader's routing of snapshot records by topic.
//! - [`columns`]: bulk columnar decode of transaction and pending-ack logs.
//! - [`proto`]: prost types for every storage format.
//! - [`ledger`]: durable managed ledgers with cursors and compacted topics.
//! - [`message`]: topic entries in Pulsar's format (metadata, batches,
//!   transaction markers).
//! - [`topic_scan`]: topic messages of a ledger range or a remote segment as
//!   columns (what the Spark data source `txnstream` reads).
//! - [`tiered`]: the aborted-transaction index and remote segment offset index.
//! - [`writer`]: the PIP-160 `BufferedWriter` (batched log writes).
//! - [`replay`]: live records of a mixed batched/unbatched log, columnar.
//! - [`log_scan`]: every stored record of a log range with deleted flags and
//!   error rows instead of failures (what Spark reads).
//! - [`txnlog_record`], [`txnlog_fold`]: coordinator log records encoded from
//!   arguments, and the recovery fold of a whole log into live transactions.

pub mod ackset;
pub mod columns;
pub mod demux;
pub mod error;
pub mod fork;
pub mod frame;
pub mod ledger;
pub mod log_scan;
pub mod message;
pub mod position;
pub mod proto;
pub mod replay;
pub mod sink;
pub mod sync;
pub mod tiered;
pub mod topic_scan;
pub mod txnlog_fold;
pub mod txnlog_record;
pub mod wire;
pub mod writer;

pub use ackset::AckSet;
pub use error::{Error, Result};
pub use position::{Position, TxnPosition};
pub use writer::{BufferedWriter, WriterConfig};
