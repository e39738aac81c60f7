from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TerminatedTxn(_message.Message):
    __slots__ = ("txnid_least_bits", "txnid_most_bits", "status", "end_time", "timed_out")
    TXNID_LEAST_BITS_FIELD_NUMBER: _ClassVar[int]
    TXNID_MOST_BITS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    txnid_least_bits: int
    txnid_most_bits: int
    status: int
    end_time: int
    timed_out: bool
    def __init__(self, txnid_least_bits: _Optional[int] = ..., txnid_most_bits: _Optional[int] = ..., status: _Optional[int] = ..., end_time: _Optional[int] = ..., timed_out: _Optional[bool] = ...) -> None: ...

class TerminatedTxnState(_message.Message):
    __slots__ = ("client_name", "txns")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    TXNS_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    txns: _containers.RepeatedCompositeFieldContainer[TerminatedTxn]
    def __init__(self, client_name: _Optional[str] = ..., txns: _Optional[_Iterable[_Union[TerminatedTxn, _Mapping]]] = ...) -> None: ...
