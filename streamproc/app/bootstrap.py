"""Which Kafka cluster to talk to: the configured one, else the running built-in broker.

Kept apart from the faust app so that the ops commands resolve an address without importing faust.
"""

from __future__ import annotations

from streamproc.devstack.cluster import local_kafka
from streamproc.errors import UserFacingError
from streamproc.settings import Settings


class NoBrokerError(UserFacingError):
    """Neither a configured cluster nor a running local broker."""


def resolve_bootstrap(settings: Settings) -> str:
    """The configured cluster, else the running built-in broker (or local cluster: every node's address)."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    status = local_kafka(settings).status()
    if status.bootstrap is None:
        raise NoBrokerError(
            "no Kafka broker: pass -b host:port, set STREAMPROC_KAFKA_BOOTSTRAP=host:port, or start the built-in "
            "one with `streamproc broker start`"
        )
    return status.bootstrap
