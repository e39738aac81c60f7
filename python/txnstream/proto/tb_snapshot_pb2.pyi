from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AbortTxnMetadata(_message.Message):
    __slots__ = ("txnid_least_bits", "txnid_most_bits", "ledgerId", "entryId")
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    txnid_least_bits: int
    txnid_most_bits: int
    ledgerId: int
    entryId: int
    def __init__(self, txnid_least_bits: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ...) -> None: ...

class ProducerSequence(_message.Message):
    __slots__ = ("producer_name", "last_sequence_id", "sequence_ids", "ledger_ids", "entry_ids", "batch_indexes", "batch_sizes", "txn_refs")
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEXES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    TXN_REFS_FIELD_NUMBER: _ClassVar[int]
    producer_name: str
    last_sequence_id: int
    sequence_ids: _containers.RepeatedScalarFieldContainer[int]
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    batch_indexes: _containers.RepeatedScalarFieldContainer[int]
    batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    txn_refs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, producer_name: _Optional[str] = ..., last_sequence_id: _Optional[int] = ..., sequence_ids: _Optional[_Iterable[int]] = ..., ledger_ids: _Optional[_Iterable[int]] = ..., entry_ids: _Optional[_Iterable[int]] = ..., batch_indexes: _Optional[_Iterable[int]] = ..., batch_sizes: _Optional[_Iterable[int]] = ..., txn_refs: _Optional[_Iterable[int]] = ...) -> None: ...

class TxnRef(_message.Message):
    __slots__ = ("txnid_most_bits", "txnid_least_bits", "aborted")
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    txnid_most_bits: int
    txnid_least_bits: int
    aborted: bool
    def __init__(self, txnid_most_bits: _Optional[int] = ..., txnid_least_bits: _Optional[int] = ..., aborted: _Optional[bool] = ...) -> None: ...

class TransactionBufferSnapshot(_message.Message):
    __slots__ = ("topic_name", "max_read_position_ledgerId", "max_read_position_entryId", "abort_txn_metadata", "producer_sequences", "message_txns", "snapshot_time_ms", "dedup_complete")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_READ_POSITION_LEDGERID_FIELD_NUMBER: _ClassVar[int]
    MAX_READ_POSITION_ENTRYID_FIELD_NUMBER: _ClassVar[int]
    ABORT_TXN_METADATA_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TXNS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    max_read_position_ledgerId: int
    max_read_position_entryId: int
    abort_txn_metadata: _containers.RepeatedCompositeFieldContainer[AbortTxnMetadata]
    producer_sequences: _containers.RepeatedCompositeFieldContainer[ProducerSequence]
    message_txns: _containers.RepeatedCompositeFieldContainer[TxnRef]
    snapshot_time_ms: int
    dedup_complete: bool
    def __init__(self, topic_name: _Optional[str] = ..., max_read_position_ledgerId: _Optional[int] = ..., max_read_position_entryId: _Optional[int] = ..., abort_txn_metadata: _Optional[_Iterable[_Union[AbortTxnMetadata, _Mapping]]] = ..., producer_sequences: _Optional[_Iterable[_Union[ProducerSequence, _Mapping]]] = ..., message_txns: _Optional[_Iterable[_Union[TxnRef, _Mapping]]] = ..., snapshot_time_ms: _Optional[int] = ..., dedup_complete: _Optional[bool] = ...) -> None: ...
