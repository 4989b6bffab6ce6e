from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodeRequest(_message.Message):
    __slots__ = ("catalog", "version", "intent", "k")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    intent: str
    k: int
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., intent: _Optional[str] = ..., k: _Optional[int] = ...) -> None: ...

class Pointer(_message.Message):
    __slots__ = ("index", "tool", "catalog_version", "token_ids", "score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    tool: str
    catalog_version: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    score: float
    def __init__(self, index: _Optional[int] = ..., tool: _Optional[str] = ..., catalog_version: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., score: _Optional[float] = ...) -> None: ...

class DecodeSummary(_message.Message):
    __slots__ = ("tokens_generated", "prefill_seconds", "decode_seconds", "catalog_version")
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    tokens_generated: int
    prefill_seconds: float
    decode_seconds: float
    catalog_version: int
    def __init__(self, tokens_generated: _Optional[int] = ..., prefill_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., catalog_version: _Optional[int] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("pointer", "summary")
    POINTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    pointer: Pointer
    summary: DecodeSummary
    def __init__(self, pointer: _Optional[_Union[Pointer, _Mapping]] = ..., summary: _Optional[_Union[DecodeSummary, _Mapping]] = ...) -> None: ...
