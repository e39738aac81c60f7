from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerInfo(_message.Message):
    __slots__ = ("ledger_id", "entries", "size_bytes", "file_entries")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entries: int
    size_bytes: int
    file_entries: int
    def __init__(self, ledger_id: _Optional[int] = ..., entries: _Optional[int] = ..., size_bytes: _Optional[int] = ..., file_entries: _Optional[int] = ...) -> None: ...

class DeletedRange(_message.Message):
    __slots__ = ("start_ledger_id", "start_entry_id", "end_ledger_id", "end_entry_id")
    START_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    START_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    END_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    END_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    start_ledger_id: int
    start_entry_id: int
    end_ledger_id: int
    end_entry_id: int
    def __init__(self, start_ledger_id: _Optional[int] = ..., start_entry_id: _Optional[int] = ..., end_ledger_id: _Optional[int] = ..., end_entry_id: _Optional[int] = ...) -> None: ...

class BatchDeletion(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "batch_size", "ack_set")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACK_SET_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    batch_size: int
    ack_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_size: _Optional[int] = ..., ack_set: _Optional[_Iterable[int]] = ...) -> None: ...

class CursorState(_message.Message):
    __slots__ = ("name", "mark_delete_ledger_id", "mark_delete_entry_id", "deleted", "batch_deletions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    BATCH_DELETIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mark_delete_ledger_id: int
    mark_delete_entry_id: int
    deleted: _containers.RepeatedCompositeFieldContainer[DeletedRange]
    batch_deletions: _containers.RepeatedCompositeFieldContainer[BatchDeletion]
    def __init__(self, name: _Optional[str] = ..., mark_delete_ledger_id: _Optional[int] = ..., mark_delete_entry_id: _Optional[int] = ..., deleted: _Optional[_Iterable[_Union[DeletedRange, _Mapping]]] = ..., batch_deletions: _Optional[_Iterable[_Union[BatchDeletion, _Mapping]]] = ...) -> None: ...

class ManagedLedgerState(_message.Message):
    __slots__ = ("id", "name", "ledgers", "cursors", "next_ledger_id", "compacted")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    NEXT_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    ledgers: _containers.RepeatedCompositeFieldContainer[LedgerInfo]
    cursors: _containers.RepeatedCompositeFieldContainer[CursorState]
    next_ledger_id: int
    compacted: bool
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., ledgers: _Optional[_Iterable[_Union[LedgerInfo, _Mapping]]] = ..., cursors: _Optional[_Iterable[_Union[CursorState, _Mapping]]] = ..., next_ledger_id: _Optional[int] = ..., compacted: _Optional[bool] = ...) -> None: ...

class Catalog(_message.Message):
    __slots__ = ("format_version", "checkpoint", "next_ml_id", "ledgers", "sequence")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ML_ID_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    checkpoint: int
    next_ml_id: int
    ledgers: _containers.RepeatedCompositeFieldContainer[ManagedLedgerState]
    sequence: int
    def __init__(self, format_version: _Optional[int] = ..., checkpoint: _Optional[int] = ..., next_ml_id: _Optional[int] = ..., ledgers: _Optional[_Iterable[_Union[ManagedLedgerState, _Mapping]]] = ..., sequence: _Optional[int] = ...) -> None: ...

class CompactedRecord(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
