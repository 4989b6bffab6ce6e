import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VersionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_STATE_UNSPECIFIED: _ClassVar[VersionState]
    VERSION_STATE_STAGED: _ClassVar[VersionState]
    VERSION_STATE_ACTIVE: _ClassVar[VersionState]
    VERSION_STATE_RETIRED: _ClassVar[VersionState]

class CatalogView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATALOG_VIEW_UNSPECIFIED: _ClassVar[CatalogView]
    CATALOG_VIEW_FULL: _ClassVar[CatalogView]
    CATALOG_VIEW_NAMES: _ClassVar[CatalogView]

class GrammarMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAMMAR_MODE_UNSPECIFIED: _ClassVar[GrammarMode]
    GRAMMAR_MODE_TOKEN: _ClassVar[GrammarMode]
    GRAMMAR_MODE_CHAR: _ClassVar[GrammarMode]
VERSION_STATE_UNSPECIFIED: VersionState
VERSION_STATE_STAGED: VersionState
VERSION_STATE_ACTIVE: VersionState
VERSION_STATE_RETIRED: VersionState
CATALOG_VIEW_UNSPECIFIED: CatalogView
CATALOG_VIEW_FULL: CatalogView
CATALOG_VIEW_NAMES: CatalogView
GRAMMAR_MODE_UNSPECIFIED: GrammarMode
GRAMMAR_MODE_TOKEN: GrammarMode
GRAMMAR_MODE_CHAR: GrammarMode

class Tool(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "extra_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    EXTRA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    extra_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., extra_json: _Optional[str] = ...) -> None: ...

class ToolList(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class CatalogVersion(_message.Message):
    __slots__ = ("catalog", "number", "content_sha256", "author", "created_at", "parent", "state", "tool_count")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOOL_COUNT_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    number: int
    content_sha256: str
    author: str
    created_at: _timestamp_pb2.Timestamp
    parent: int
    state: VersionState
    tool_count: int
    def __init__(self, catalog: _Optional[str] = ..., number: _Optional[int] = ..., content_sha256: _Optional[str] = ..., author: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent: _Optional[int] = ..., state: _Optional[_Union[VersionState, str]] = ..., tool_count: _Optional[int] = ...) -> None: ...

class Catalog(_message.Message):
    __slots__ = ("name", "active_version", "latest_version", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    active_version: int
    latest_version: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., active_version: _Optional[int] = ..., latest_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PushCatalogRequest(_message.Message):
    __slots__ = ("catalog", "mcp_tools_list_json", "tools", "activate")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    MCP_TOOLS_LIST_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    mcp_tools_list_json: bytes
    tools: ToolList
    activate: bool
    def __init__(self, catalog: _Optional[str] = ..., mcp_tools_list_json: _Optional[bytes] = ..., tools: _Optional[_Union[ToolList, _Mapping]] = ..., activate: _Optional[bool] = ...) -> None: ...

class PushCatalogResponse(_message.Message):
    __slots__ = ("version", "created", "compiled")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    created: bool
    compiled: _containers.RepeatedCompositeFieldContainer[CompileResult]
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., created: _Optional[bool] = ..., compiled: _Optional[_Iterable[_Union[CompileResult, _Mapping]]] = ...) -> None: ...

class GetCatalogRequest(_message.Message):
    __slots__ = ("catalog", "version", "view")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    view: CatalogView
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., view: _Optional[_Union[CatalogView, str]] = ...) -> None: ...

class GetCatalogResponse(_message.Message):
    __slots__ = ("version", "tools")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class ListCatalogsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCatalogsResponse(_message.Message):
    __slots__ = ("catalogs", "next_page_token")
    CATALOGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    catalogs: _containers.RepeatedCompositeFieldContainer[Catalog]
    next_page_token: str
    def __init__(self, catalogs: _Optional[_Iterable[_Union[Catalog, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("catalog", "page_size", "page_token")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    page_size: int
    page_token: str
    def __init__(self, catalog: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "next_page_token")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[CatalogVersion]
    next_page_token: str
    def __init__(self, versions: _Optional[_Iterable[_Union[CatalogVersion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DiffVersionsRequest(_message.Message):
    __slots__ = ("catalog", "from_version", "to_version")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    from_version: int
    to_version: int
    def __init__(self, catalog: _Optional[str] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ...) -> None: ...

class ToolChange(_message.Message):
    __slots__ = ("name", "fields")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class DiffVersionsResponse(_message.Message):
    __slots__ = ("added", "removed", "changed")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    changed: _containers.RepeatedCompositeFieldContainer[ToolChange]
    def __init__(self, added: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., changed: _Optional[_Iterable[_Union[ToolChange, _Mapping]]] = ...) -> None: ...

class ActivateVersionRequest(_message.Message):
    __slots__ = ("catalog", "version", "expected_current_version")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    expected_current_version: int
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., expected_current_version: _Optional[int] = ...) -> None: ...

class ActivateVersionResponse(_message.Message):
    __slots__ = ("version", "previous_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    previous_version: int
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., previous_version: _Optional[int] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("catalog",)
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    def __init__(self, catalog: _Optional[str] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("version", "previous_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    previous_version: int
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., previous_version: _Optional[int] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("id", "at", "actor", "action", "catalog", "version", "detail_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: _timestamp_pb2.Timestamp
    actor: str
    action: str
    catalog: str
    version: int
    detail_json: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., catalog: _Optional[str] = ..., version: _Optional[int] = ..., detail_json: _Optional[str] = ...) -> None: ...

class ListAuditEventsRequest(_message.Message):
    __slots__ = ("catalog", "page_size", "page_token")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    page_size: int
    page_token: str
    def __init__(self, catalog: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class TokenizerBlob(_message.Message):
    __slots__ = ("fingerprint", "kind", "data", "name")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    kind: str
    data: bytes
    name: str
    def __init__(self, fingerprint: _Optional[str] = ..., kind: _Optional[str] = ..., data: _Optional[bytes] = ..., name: _Optional[str] = ...) -> None: ...

class RegisterTokenizerRequest(_message.Message):
    __slots__ = ("tokenizer",)
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    tokenizer: TokenizerBlob
    def __init__(self, tokenizer: _Optional[_Union[TokenizerBlob, _Mapping]] = ...) -> None: ...

class RegisterTokenizerResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class CompileStats(_message.Message):
    __slots__ = ("nodes", "edges", "max_out_degree", "depth", "bytes", "root_out_degree", "fits_constant_bank", "compile_seconds")
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUT_DEGREE_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ROOT_OUT_DEGREE_FIELD_NUMBER: _ClassVar[int]
    FITS_CONSTANT_BANK_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    edges: int
    max_out_degree: int
    depth: int
    bytes: int
    root_out_degree: int
    fits_constant_bank: bool
    compile_seconds: float
    def __init__(self, nodes: _Optional[int] = ..., edges: _Optional[int] = ..., max_out_degree: _Optional[int] = ..., depth: _Optional[int] = ..., bytes: _Optional[int] = ..., root_out_degree: _Optional[int] = ..., fits_constant_bank: _Optional[bool] = ..., compile_seconds: _Optional[float] = ...) -> None: ...

class CompileResult(_message.Message):
    __slots__ = ("tokenizer_fingerprint", "tokenizer_name", "mode", "ok", "error", "stats")
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    tokenizer_fingerprint: str
    tokenizer_name: str
    mode: GrammarMode
    ok: bool
    error: str
    stats: CompileStats
    def __init__(self, tokenizer_fingerprint: _Optional[str] = ..., tokenizer_name: _Optional[str] = ..., mode: _Optional[_Union[GrammarMode, str]] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., stats: _Optional[_Union[CompileStats, _Mapping]] = ...) -> None: ...

class CompileCatalogRequest(_message.Message):
    __slots__ = ("catalog", "version", "tokenizer_fingerprint", "mode")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    tokenizer_fingerprint: str
    mode: GrammarMode
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., mode: _Optional[_Union[GrammarMode, str]] = ...) -> None: ...

class CompileCatalogResponse(_message.Message):
    __slots__ = ("version", "result")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    result: CompileResult
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., result: _Optional[_Union[CompileResult, _Mapping]] = ...) -> None: ...

class GetCatalogStatusRequest(_message.Message):
    __slots__ = ("catalog",)
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    def __init__(self, catalog: _Optional[str] = ...) -> None: ...

class DecoderGrammarStatus(_message.Message):
    __slots__ = ("node_id", "tokenizer_fingerprint", "connected", "applied_version", "applied_at", "nacked_version", "nack_error", "last_seen")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_AT_FIELD_NUMBER: _ClassVar[int]
    NACKED_VERSION_FIELD_NUMBER: _ClassVar[int]
    NACK_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tokenizer_fingerprint: str
    connected: bool
    applied_version: int
    applied_at: _timestamp_pb2.Timestamp
    nacked_version: int
    nack_error: str
    last_seen: _timestamp_pb2.Timestamp
    def __init__(self, node_id: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., connected: _Optional[bool] = ..., applied_version: _Optional[int] = ..., applied_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nacked_version: _Optional[int] = ..., nack_error: _Optional[str] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetCatalogStatusResponse(_message.Message):
    __slots__ = ("catalog", "active_version", "decoders")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DECODERS_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    active_version: int
    decoders: _containers.RepeatedCompositeFieldContainer[DecoderGrammarStatus]
    def __init__(self, catalog: _Optional[str] = ..., active_version: _Optional[int] = ..., decoders: _Optional[_Iterable[_Union[DecoderGrammarStatus, _Mapping]]] = ...) -> None: ...

class HeldGrammar(_message.Message):
    __slots__ = ("catalog", "version")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class DecoderHello(_message.Message):
    __slots__ = ("node_id", "tokenizer_fingerprint", "held", "mode")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tokenizer_fingerprint: str
    held: _containers.RepeatedCompositeFieldContainer[HeldGrammar]
    mode: GrammarMode
    def __init__(self, node_id: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., held: _Optional[_Iterable[_Union[HeldGrammar, _Mapping]]] = ..., mode: _Optional[_Union[GrammarMode, str]] = ...) -> None: ...

class GrammarAck(_message.Message):
    __slots__ = ("nonce", "catalog", "version")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    catalog: str
    version: int
    def __init__(self, nonce: _Optional[str] = ..., catalog: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GrammarNack(_message.Message):
    __slots__ = ("nonce", "catalog", "version", "kept_version", "error")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KEPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    catalog: str
    version: int
    kept_version: int
    error: str
    def __init__(self, nonce: _Optional[str] = ..., catalog: _Optional[str] = ..., version: _Optional[int] = ..., kept_version: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("hello", "tokenizer", "ack", "nack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    hello: DecoderHello
    tokenizer: TokenizerBlob
    ack: GrammarAck
    nack: GrammarNack
    def __init__(self, hello: _Optional[_Union[DecoderHello, _Mapping]] = ..., tokenizer: _Optional[_Union[TokenizerBlob, _Mapping]] = ..., ack: _Optional[_Union[GrammarAck, _Mapping]] = ..., nack: _Optional[_Union[GrammarNack, _Mapping]] = ...) -> None: ...

class TokenizerWanted(_message.Message):
    __slots__ = ("fingerprint",)
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    def __init__(self, fingerprint: _Optional[str] = ...) -> None: ...

class GrammarUpdate(_message.Message):
    __slots__ = ("catalog", "version", "nonce", "mode", "trie", "tools", "content_sha256")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TRIE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    version: int
    nonce: str
    mode: GrammarMode
    trie: bytes
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    content_sha256: str
    def __init__(self, catalog: _Optional[str] = ..., version: _Optional[int] = ..., nonce: _Optional[str] = ..., mode: _Optional[_Union[GrammarMode, str]] = ..., trie: _Optional[bytes] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., content_sha256: _Optional[str] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("tokenizer_wanted", "grammar")
    TOKENIZER_WANTED_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    tokenizer_wanted: TokenizerWanted
    grammar: GrammarUpdate
    def __init__(self, tokenizer_wanted: _Optional[_Union[TokenizerWanted, _Mapping]] = ..., grammar: _Optional[_Union[GrammarUpdate, _Mapping]] = ...) -> None: ...
