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
VERSION_STATE_UNSPECIFIED: VersionState
VERSION_STATE_STAGED: VersionState
VERSION_STATE_ACTIVE: VersionState
VERSION_STATE_RETIRED: VersionState
CATALOG_VIEW_UNSPECIFIED: CatalogView
CATALOG_VIEW_FULL: CatalogView
CATALOG_VIEW_NAMES: CatalogView

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
    __slots__ = ("version", "created")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    version: CatalogVersion
    created: bool
    def __init__(self, version: _Optional[_Union[CatalogVersion, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

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
