//! `txnstream._native`: thin PyO3 bindings over `txnstream-core`.
//!
//! Functions extract their arguments, release the GIL for bulk work and I/O,
//! and convert errors in one place (`errors.rs`).

mod ackset;
mod args;
mod buffers;
mod completion;
mod demux;
mod errors;
mod frame;
mod ledger;
mod log_scan;
mod message;
mod position;
mod replay;
#[cfg(feature = "testing")]
mod testing;
mod tiered;
mod topic_scan;
mod txnlog;
mod writer;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAGIC", txnstream_core::frame::MAGIC)?;
    m.add("VERSION", txnstream_core::frame::VERSION)?;
    m.add("MAX_BATCH_SIZE", txnstream_core::ackset::MAX_BATCH_SIZE)?;
    m.add("MAX_ENTRY_SIZE", txnstream_core::ledger::MAX_ENTRY_SIZE)?;
    m.add(
        "HOLD_CURSOR_PREFIX",
        txnstream_core::ledger::HOLD_CURSOR_PREFIX,
    )?;
    m.add_function(wrap_pyfunction!(frame::encode_batch, m)?)?;
    m.add_function(wrap_pyfunction!(frame::decode_entry, m)?)?;
    m.add_function(wrap_pyfunction!(frame::is_batched, m)?)?;
    m.add_function(wrap_pyfunction!(frame::decode_entries, m)?)?;
    m.add_function(wrap_pyfunction!(frame::decode_txn_log_columns, m)?)?;
    m.add_function(wrap_pyfunction!(frame::decode_pending_ack_columns, m)?)?;
    m.add_function(wrap_pyfunction!(frame::arrow_is_batched, m)?)?;
    m.add_function(wrap_pyfunction!(frame::arrow_decode_entries, m)?)?;
    m.add_function(wrap_pyfunction!(frame::arrow_txn_log_columns, m)?)?;
    m.add_function(wrap_pyfunction!(frame::arrow_pending_ack_columns, m)?)?;
    m.add_function(wrap_pyfunction!(log_scan::scan_log, m)?)?;
    m.add_class::<position::PyPosition>()?;
    m.add_class::<position::PyTxnPosition>()?;
    m.add_class::<ackset::PyAckSet>()?;
    m.add_function(wrap_pyfunction!(ackset::ackset_and_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_cardinality_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_is_empty_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_overlaps_many, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_list_cardinality, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_list_is_empty, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_list_and, m)?)?;
    m.add_function(wrap_pyfunction!(ackset::ackset_list_overlaps, m)?)?;
    m.add_class::<ledger::PyManagedLedger>()?;
    m.add_class::<ledger::PyCursor>()?;
    m.add_class::<ledger::PyCompactedTopic>()?;
    m.add_class::<writer::PyBufferedWriter>()?;
    m.add_function(wrap_pyfunction!(replay::replay_log, m)?)?;
    m.add_function(wrap_pyfunction!(txnlog::encode_txn_new, m)?)?;
    m.add_function(wrap_pyfunction!(txnlog::encode_txn_add_partitions, m)?)?;
    m.add_function(wrap_pyfunction!(txnlog::encode_txn_add_subscriptions, m)?)?;
    m.add_function(wrap_pyfunction!(txnlog::encode_txn_update, m)?)?;
    m.add_function(wrap_pyfunction!(replay::fold_txn_log, m)?)?;
    m.add_function(wrap_pyfunction!(txnlog::fold_txn_entries, m)?)?;
    m.add_function(wrap_pyfunction!(message::encode_message, m)?)?;
    m.add_function(wrap_pyfunction!(message::encode_batch_message, m)?)?;
    m.add_function(wrap_pyfunction!(message::encode_marker, m)?)?;
    m.add_function(wrap_pyfunction!(message::decode_topic_entry, m)?)?;
    m.add_function(wrap_pyfunction!(message::read_messages, m)?)?;
    m.add_function(wrap_pyfunction!(message::scan_topic, m)?)?;
    m.add_function(wrap_pyfunction!(topic_scan::scan_topic_columns, m)?)?;
    m.add_function(wrap_pyfunction!(topic_scan::scan_segment_columns, m)?)?;
    m.add_class::<demux::PySnapshotDemux>()?;
    m.add_class::<tiered::PyAbortedTxnIndex>()?;
    m.add_class::<tiered::PySegmentIndex>()?;
    m.add_function(wrap_pyfunction!(tiered::export_segment, m)?)?;
    m.add_function(wrap_pyfunction!(tiered::decode_segment, m)?)?;
    m.add_function(wrap_pyfunction!(tiered::buffer_crc32c, m)?)?;
    #[cfg(feature = "testing")]
    testing::register(m)?;
    Ok(())
}
