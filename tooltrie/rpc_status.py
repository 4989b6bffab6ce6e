"""gRPC statuses with google.rpc details, so clients see which field was wrong and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One wrong field of a request: its path (`tools[3].name`) and what was wrong with it."""

    field: str
    description: str


def retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromMilliseconds(int(seconds * 1000))
    return info


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str, details: Sequence[Message] = ()) -> None:
    status = status_pb2.Status(code=code.value[0], message=message)
    for detail in details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    context.abort_with_status(rpc_status.to_status(status))


def bad_request(violations: Sequence[FieldViolation]) -> error_details_pb2.BadRequest:
    return error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description) for v in violations
        ]
    )
