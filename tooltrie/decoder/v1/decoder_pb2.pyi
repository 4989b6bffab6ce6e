from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("catalog", "version", "intent", "k", "messages")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    intent: str
    k: int
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., intent: _Optional[str] = ..., k: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class Pointer(_message.Message):
    __slots__ = ("index", "tool", "catalog_version", "token_ids", "score", "seconds")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    index: int
    tool: str
    catalog_version: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    score: float
    seconds: float
    def __init__(self, index: _Optional[int] = ..., tool: _Optional[str] = ..., catalog_version: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., score: _Optional[float] = ..., seconds: _Optional[float] = ...) -> None: ...

class DecodeSummary(_message.Message):
    __slots__ = ("tokens_generated", "prefill_seconds", "decode_seconds", "catalog_version", "prompt_tokens", "prefix_cached", "engine", "forward_passes")
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    tokens_generated: int
    prefill_seconds: float
    decode_seconds: float
    catalog_version: int
    prompt_tokens: int
    prefix_cached: bool
    engine: str
    forward_passes: int
    def __init__(self, tokens_generated: _Optional[int] = ..., prefill_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., catalog_version: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., prefix_cached: _Optional[bool] = ..., engine: _Optional[str] = ..., forward_passes: _Optional[int] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("pointer", "summary")
    POINTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    pointer: Pointer
    summary: DecodeSummary
    def __init__(self, pointer: _Optional[_Union[Pointer, _Mapping]] = ..., summary: _Optional[_Union[DecodeSummary, _Mapping]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeldCatalog(_message.Message):
    __slots__ = ("catalog", "active_version", "held_versions")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    active_version: int
    held_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, catalog: _Optional[str] = ..., active_version: _Optional[int] = ..., held_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("node_id", "engine", "model", "tokenizer", "tokenizer_fingerprint", "registry_connected", "catalogs", "engine_failure", "context")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    CATALOGS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FAILURE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    engine: str
    model: str
    tokenizer: str
    tokenizer_fingerprint: str
    registry_connected: bool
    catalogs: _containers.RepeatedCompositeFieldContainer[HeldCatalog]
    engine_failure: str
    context: int
    def __init__(self, node_id: _Optional[str] = ..., engine: _Optional[str] = ..., model: _Optional[str] = ..., tokenizer: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., registry_connected: _Optional[bool] = ..., catalogs: _Optional[_Iterable[_Union[HeldCatalog, _Mapping]]] = ..., engine_failure: _Optional[str] = ..., context: _Optional[int] = ...) -> None: ...
