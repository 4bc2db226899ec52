"""The Kafka ACLs each streamproc principal needs, derived from the topology alone (design §6, docs/security.md).

Three principals run the pipeline: ``worker`` (the faust workers, and every other command: it may do all the
pipeline does), ``submitter`` (submit, status, batches, results, cancel, backfill, lag) and ``sink``. What each
command touches:

* every command that ensures the topics (submit, worker, sink) creates the missing ones and describes all of
  them, the state changelog included: Create + Describe on ``<prefix>.`` and on the changelog;
* the worker consumes ``<prefix>.requests`` (and ``.requests.high``/``.requests.low``, each tenant group's ``.g<k>``),
  the retry tiers and the manifests, writes results, failures, retries and dead letters, reads and writes the
  workers' beats (``<prefix>.fleet``), writes the batch summaries (``<prefix>.summaries``), will read and write the open
  provider batches (``<prefix>.provider-batches``, issue 31: nothing does yet) and describes its group (the beats'
  fallback), and faust creates, writes and reads its own topics, all named ``<app_id>-...`` (the table's
  changelog, its leader topic); its group is the app id;
* idempotent producers (submit, cancel, backfill, the worker) need IdempotentWrite on the cluster;
* status and lag read the workers' group's offsets (Describe on the group; lag also the sink's), status, batches
  and backfill read the state changelog, results and backfill read the failure topics, status, batches and results
  read the manifests, cancel rewrites one, status reads the workers' beats (the deployments out of rotation);
  status and batches read the batch summaries (``status --verify`` the state changelog);
* the sink reads results, failures and dead letters in its own group ``<app_id>.sink`` (or one named after it).

Read and Write imply Describe in Kafka; it is still listed where a principal needs it, so the plan reads plainly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from streamproc.core.topology import Topology

WORKER: Final = "worker"
SUBMITTER: Final = "submitter"
SINK: Final = "sink"
ADMIN: Final = "admin"
PIPELINE_PRINCIPALS: Final = (WORKER, SUBMITTER, SINK)
PRINCIPALS: Final = (ADMIN, *PIPELINE_PRINCIPALS)


class ResourceType(StrEnum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"
    TRANSACTIONAL_ID = "TransactionalId"


class PatternType(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


@dataclass(frozen=True, order=True)
class Resource:
    type: ResourceType
    name: str
    pattern: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        return f"{self.type}:{self.pattern}:{self.name}"


CLUSTER: Final = Resource(ResourceType.CLUSTER, "kafka-cluster")


@dataclass(frozen=True)
class Grant:
    """ALLOW ``operations`` on ``resource`` to ``User:<user>`` from any host."""

    user: str
    operations: tuple[str, ...]
    resource: Resource

    @property
    def principal(self) -> str:
        return f"User:{self.user}"

    def line(self) -> str:
        """``User:worker  ALLOW  Read,Write  Topic:PREFIXED:llm.``"""
        return f"{self.principal}  ALLOW  {','.join(self.operations)}  {self.resource}"

    def allows(self, user: str, operation: str, resource_type: ResourceType, name: str) -> bool:
        """Kafka's reading of this grant: ``All`` is every operation, and Read, Write, Delete and Alter imply
        Describe; a PREFIXED name matches every name starting with it, the LITERAL ``*`` every name."""
        if user != self.user or resource_type != self.resource.type:
            return False
        implied = {"Describe"} if set(self.operations) & {"Read", "Write", "Delete", "Alter"} else set()
        if "All" not in self.operations and operation not in {*self.operations, *implied}:
            return False
        if self.resource.pattern is PatternType.PREFIXED:
            return name.startswith(self.resource.name)
        return self.resource.name in (name, "*")


def permits(plan: list[Grant], user: str, operation: str, resource_type: ResourceType, name: str) -> bool:
    """Whether ``plan`` lets ``user`` do ``operation`` on the resource (there are no DENY grants)."""
    return any(grant.allows(user, operation, resource_type, name) for grant in plan)


def sink_group_prefix(topology: Topology) -> str:
    """The sink's default group (``streamproc sink``) and the prefix of any other the sink may be given."""
    return f"{topology.app_id}.sink"


def _sink_groups(topology: Topology) -> Resource:
    return Resource(ResourceType.GROUP, sink_group_prefix(topology), PatternType.PREFIXED)


def _topic_prefix(topology: Topology) -> Resource:
    return Resource(ResourceType.TOPIC, f"{topology.prefix}.", PatternType.PREFIXED)


def _ensure_topics(user: str, topology: Topology, changelog: tuple[str, ...] = ()) -> list[Grant]:
    """What ``ensure_pipeline_topics`` does: create the missing topics, describe all of them (and ``changelog``:
    what else the principal does with the state changelog)."""
    return [Grant(user, ("Create", "Describe"), _topic_prefix(topology)),
            Grant(user, (*changelog, "Create", "Describe"), Resource(ResourceType.TOPIC, topology.state_changelog))]


def _failure_topics(topology: Topology) -> Resource:
    return Resource(ResourceType.TOPIC, f"{topology.prefix}.failed.", PatternType.PREFIXED)


def worker_grants(topology: Topology) -> list[Grant]:
    every = ("Read", "Write", "Create", "Describe")
    return [
        Grant(WORKER, every, _topic_prefix(topology)),
        Grant(WORKER, every, Resource(ResourceType.TOPIC, f"{topology.app_id}-", PatternType.PREFIXED)),
        Grant(WORKER, ("Read", "Describe"), Resource(ResourceType.GROUP, topology.app_id)),
        Grant(WORKER, ("Read", "Describe"), _sink_groups(topology)),
        Grant(WORKER, ("IdempotentWrite",), CLUSTER),
    ]


def submitter_grants(topology: Topology) -> list[Grant]:
    return [
        *_ensure_topics(SUBMITTER, topology, changelog=("Read",)),
        # ``<prefix>.requests`` and each priority's and tenant group's ``<prefix>.requests.<p>[.g<k>]`` (design §5.11):
        # nothing else
        Grant(SUBMITTER, ("Write", "Describe"), Resource(ResourceType.TOPIC, topology.requests, PatternType.PREFIXED)),
        Grant(SUBMITTER, ("Read", "Write", "Describe"), Resource(ResourceType.TOPIC, topology.batches)),
        Grant(SUBMITTER, ("Read", "Describe"), Resource(ResourceType.TOPIC, topology.fleet)),
        Grant(SUBMITTER, ("Read", "Describe"), Resource(ResourceType.TOPIC, topology.summaries)),
        Grant(SUBMITTER, ("Read", "Describe"), Resource(ResourceType.TOPIC, topology.results)),
        Grant(SUBMITTER, ("Read", "Describe"), _failure_topics(topology)),
        Grant(SUBMITTER, ("Describe",), Resource(ResourceType.GROUP, topology.app_id)),
        Grant(SUBMITTER, ("Describe",), _sink_groups(topology)),
        Grant(SUBMITTER, ("IdempotentWrite",), CLUSTER),
    ]


def sink_grants(topology: Topology) -> list[Grant]:
    return [
        *_ensure_topics(SINK, topology),
        Grant(SINK, ("Read", "Describe"), Resource(ResourceType.TOPIC, topology.results)),
        Grant(SINK, ("Read", "Describe"), Resource(ResourceType.TOPIC, topology.dead_letters)),
        Grant(SINK, ("Read", "Describe"), _failure_topics(topology)),
        Grant(SINK, ("Read", "Describe"), _sink_groups(topology)),
    ]


def admin_grants() -> list[Grant]:
    """``admin`` operates the cluster (every topic, group and ACL) without being a super user."""
    return [Grant(ADMIN, ("All",), CLUSTER),
            Grant(ADMIN, ("All",), Resource(ResourceType.TOPIC, "*")),
            Grant(ADMIN, ("All",), Resource(ResourceType.GROUP, "*")),
            Grant(ADMIN, ("All",), Resource(ResourceType.TRANSACTIONAL_ID, "*"))]


def acl_plan(topology: Topology) -> list[Grant]:
    """Every grant of the pipeline's principals for this topology, then admin's."""
    return [*worker_grants(topology), *submitter_grants(topology), *sink_grants(topology), *admin_grants()]


def plan_lines(plan: list[Grant]) -> list[str]:
    """The plan as text, one grant a line, columns aligned (for the README and ``broker start --secure``)."""
    rows = [(g.principal, "ALLOW", ",".join(g.operations), str(g.resource)) for g in plan]
    widths = [max(len(row[i]) for row in rows) for i in range(3)] if rows else [0, 0, 0]
    return [f"{p:<{widths[0]}}  {a:<{widths[1]}}  {o:<{widths[2]}}  {r}" for p, a, o, r in rows]


@dataclass(frozen=True)
class AclCommandCall:
    """One ``kafka.admin.AclCommand --add`` call: the same operations for some principals on some resources of
    one type and pattern (the tool applies every operation to every resource it is given)."""

    users: tuple[str, ...]
    operations: tuple[str, ...]
    resources: tuple[Resource, ...]

    def arguments(self) -> list[str]:
        args = ["--add", "--force"]
        for user in self.users:
            args += ["--allow-principal", f"User:{user}"]
        for operation in self.operations:
            args += ["--operation", operation]
        for resource in self.resources:
            if resource.type is ResourceType.CLUSTER:
                args.append("--cluster")
            else:
                flag = {ResourceType.TOPIC: "--topic", ResourceType.GROUP: "--group",
                        ResourceType.TRANSACTIONAL_ID: "--transactional-id"}[resource.type]
                args += [flag, resource.name]
        args += ["--resource-pattern-type", self.resources[0].pattern.lower()]
        return args


def acl_command_calls(plan: list[Grant]) -> list[AclCommandCall]:
    """The fewest AclCommand calls that add ``plan`` (each call is a JVM start: about a second): grants with
    the same operations, resource type and pattern share a call, and so do principals with the same grants."""
    by_user: dict[tuple[str, tuple[str, ...], ResourceType, PatternType], list[Resource]] = {}
    for grant in plan:
        key = (grant.user, grant.operations, grant.resource.type, grant.resource.pattern)
        by_user.setdefault(key, [])
        if grant.resource not in by_user[key]:
            by_user[key].append(grant.resource)
    by_resources: dict[tuple[tuple[str, ...], tuple[Resource, ...]], list[str]] = {}
    for (user, operations, _, _), resources in by_user.items():
        users = by_resources.setdefault((operations, tuple(sorted(resources))), [])
        if user not in users:
            users.append(user)
    return [AclCommandCall(tuple(users), operations, resources)
            for (operations, resources), users in by_resources.items()]
