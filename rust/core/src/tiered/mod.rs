//! Tiered storage formats (SPEC §3.4, §4.8): the per-ledger aborted-transaction
//! index and the uploaded segment's offset index. The remote store itself,
//! offload policy and metadata live in Python (`txnstream.tiered`).

pub mod aborted_index;
pub mod segment;

pub use aborted_index::{AbortedTxn, AbortedTxnIndex, Collected};
pub use segment::{decode_frames, encode_segment, SegmentIndex, Slot};
