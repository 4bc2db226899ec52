"""A refused ACL as one line naming the operation and the resource, instead of a client's retry loop or traceback."""

from __future__ import annotations

import traceback

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from streamproc.errors import UserFacingError

AUTHORIZATION_ERRORS = (TopicAuthorizationFailedError, GroupAuthorizationFailedError, ClusterAuthorizationFailedError,
                        TransactionalIdAuthorizationFailed)
_RESOURCE = {TopicAuthorizationFailedError: "Topic", GroupAuthorizationFailedError: "Group",
             ClusterAuthorizationFailedError: "Cluster", TransactionalIdAuthorizationFailed: "TransactionalId"}
# which client code refused tells the operation the ACL lacks (aiokafka's errors name only the resource)
_OPERATION_BY_CALLER = (("fetcher", "Read"), ("group_coordinator", "Read"), ("producer", "Write"),
                        ("sender", "Write"), ("create_topics", "Create"), ("describe_configs", "DescribeConfigs"),
                        ("list_consumer_group_offsets", "Describe"), ("describe", "Describe"))


class NotAuthorized(UserFacingError):
    """The cluster's ACLs refuse this principal an operation it needs."""


def refused_operation(exc: BaseException) -> str:
    """Read, Write, Create, Describe...: which client call was refused, from where the error was raised."""
    frames = [f"{frame.filename} {frame.name}" for frame in traceback.extract_tb(exc.__traceback__)]
    for where in reversed(frames):
        for marker, operation in _OPERATION_BY_CALLER:
            if marker in where:
                return operation
    return "an operation"


def not_authorized(exc: BaseException, operation: str | None = None) -> NotAuthorized:
    """The one line for an authorization error: operation (when the caller knows it better than the
    traceback), resource type and name."""
    resource = next((name for kind, name in _RESOURCE.items() if isinstance(exc, kind)), "resource")
    if isinstance(exc, ClusterAuthorizationFailedError) and refused_operation(exc) == "Write":
        # an idempotent producer asks the cluster for a producer id first
        return NotAuthorized("Kafka refused IdempotentWrite on Cluster: this principal lacks that ACL "
                             "(docs/security.md lists what each role needs; or set STREAMPROC_KAFKA_IDEMPOTENCE=false)")
    names = [str(arg) for arg in exc.args if str(arg)] if exc.args else []
    named = f" {', '.join(names)}" if names else ""
    refused = operation or refused_operation(exc)
    return NotAuthorized(f"Kafka refused {refused} on {resource}{named}: this principal lacks that ACL "
                         "(docs/security.md lists what each role needs)")
