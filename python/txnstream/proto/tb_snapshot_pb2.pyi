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

class TransactionBufferSnapshot(_message.Message):
    __slots__ = ("topic_name", "max_read_position_ledgerId", "max_read_position_entryId", "abort_txn_metadata")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_READ_POSITION_LEDGERID_FIELD_NUMBER: _ClassVar[int]
    MAX_READ_POSITION_ENTRYID_FIELD_NUMBER: _ClassVar[int]
    ABORT_TXN_METADATA_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    max_read_position_ledgerId: int
    max_read_position_entryId: int
    abort_txn_metadata: _containers.RepeatedCompositeFieldContainer[AbortTxnMetadata]
    def __init__(self, topic_name: _Optional[str] = ..., max_read_position_ledgerId: _Optional[int] = ..., max_read_position_entryId: _Optional[int] = ..., abort_txn_metadata: _Optional[_Iterable[_Union[AbortTxnMetadata, _Mapping]]] = ...) -> None: ...
