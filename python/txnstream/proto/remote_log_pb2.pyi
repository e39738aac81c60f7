from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RemoteLogSegmentMetadata(_message.Message):
    __slots__ = ("topic", "ledger_id", "segment_id", "state", "first_entry", "last_entry", "entry_count", "size_bytes", "event_time", "txn_idx_empty", "txn_idx_records", "data_crc32c")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        COPY_SEGMENT_STARTED: _ClassVar[RemoteLogSegmentMetadata.State]
        COPY_SEGMENT_FINISHED: _ClassVar[RemoteLogSegmentMetadata.State]
        DELETE_SEGMENT_STARTED: _ClassVar[RemoteLogSegmentMetadata.State]
        DELETE_SEGMENT_FINISHED: _ClassVar[RemoteLogSegmentMetadata.State]
    COPY_SEGMENT_STARTED: RemoteLogSegmentMetadata.State
    COPY_SEGMENT_FINISHED: RemoteLogSegmentMetadata.State
    DELETE_SEGMENT_STARTED: RemoteLogSegmentMetadata.State
    DELETE_SEGMENT_FINISHED: RemoteLogSegmentMetadata.State
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    TXN_IDX_EMPTY_FIELD_NUMBER: _ClassVar[int]
    TXN_IDX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DATA_CRC32C_FIELD_NUMBER: _ClassVar[int]
    topic: str
    ledger_id: int
    segment_id: str
    state: RemoteLogSegmentMetadata.State
    first_entry: int
    last_entry: int
    entry_count: int
    size_bytes: int
    event_time: int
    txn_idx_empty: bool
    txn_idx_records: int
    data_crc32c: int
    def __init__(self, topic: _Optional[str] = ..., ledger_id: _Optional[int] = ..., segment_id: _Optional[str] = ..., state: _Optional[_Union[RemoteLogSegmentMetadata.State, str]] = ..., first_entry: _Optional[int] = ..., last_entry: _Optional[int] = ..., entry_count: _Optional[int] = ..., size_bytes: _Optional[int] = ..., event_time: _Optional[int] = ..., txn_idx_empty: _Optional[bool] = ..., txn_idx_records: _Optional[int] = ..., data_crc32c: _Optional[int] = ...) -> None: ...
