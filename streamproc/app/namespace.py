"""Refuse to start a deployment in its own namespace while its work is still held by the legacy shared one.

Before the app id was derived from the topic prefix, every deployment that did not set ``STREAMPROC_APP_ID``
consumed in the group ``streamproc`` and kept its state in ``streamproc-request_state-changelog``, whatever
its prefix. Such a deployment now derives ``<prefix>.streamproc`` (design §3). A group without committed
offsets starts at the earliest record and an empty state table admits everything, so starting there would
call every request still on its topics again. So when the legacy group has committed on this deployment's
input topics and the derived group has not, ``submit`` and the worker stop and say how to go on.
"""

from __future__ import annotations

from streamproc.core.topology import LEGACY_APP_ID, Topology, default_app_id
from streamproc.errors import UserFacingError
from streamproc.kafka.clients import kafka_admin
from streamproc.kafka.connection import KafkaConnection


class LegacyNamespaceError(UserFacingError):
    """This deployment's offsets and state live under the legacy app id."""


async def refuse_legacy_takeover(kafka: KafkaConnection, topology: Topology) -> None:
    """Raise :class:`LegacyNamespaceError` if a derived namespace would take over the legacy group's work."""
    if topology.app_id == LEGACY_APP_ID or topology.app_id != default_app_id(topology.prefix):
        return  # the legacy name itself, or an app id set on purpose
    inputs = set(topology.inputs)
    admin = kafka_admin(kafka)
    await admin.start()
    try:
        # only groups that exist are asked (a fresh cluster has no group coordinator until a group is used)
        groups = {entry[0] for entry in await admin.list_consumer_groups()}
        if LEGACY_APP_ID not in groups:
            return
        if not any(tp.topic in inputs for tp in await admin.list_consumer_group_offsets(LEGACY_APP_ID)):
            return
        if topology.app_id in groups and any(
                tp.topic in inputs for tp in await admin.list_consumer_group_offsets(topology.app_id)):
            return  # this namespace has consumed already: it was started on purpose
    finally:
        await admin.close()
    raise LegacyNamespaceError(
        f"the topics {topology.prefix}.* were consumed by the shared consumer group {LEGACY_APP_ID!r} of earlier "
        f"versions, and their request state is in {LEGACY_APP_ID}-request_state-changelog; this version would use "
        f"{topology.app_id!r} and call every request on those topics again. Set STREAMPROC_APP_ID={LEGACY_APP_ID} "
        "to go on as before, or give this deployment a new STREAMPROC_TOPIC_PREFIX once its batches converged "
        "(docs/design.md §3)")
