"""The ACL plan of the secure broker, from a topology alone: what each principal may do and nothing more."""

from __future__ import annotations

import pytest

from streamproc.core.acls import (
    ADMIN,
    CLUSTER,
    SINK,
    SUBMITTER,
    WORKER,
    Grant,
    PatternType,
    Resource,
    ResourceType,
    acl_command_calls,
    acl_plan,
    permits,
    plan_lines,
    sink_group_prefix,
)
from streamproc.core.retry_policy import Tier
from streamproc.core.topology import Topology, default_app_id
from streamproc.core.vocabulary import FailureLayer

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


def topology(prefix: str = "llm", app_id: str | None = None) -> Topology:
    return Topology(prefix, 4, (Tier("5s", 5000), Tier("1m", 60_000)), app_id or default_app_id(prefix))


def pipeline_topics(t: Topology) -> list[str]:
    return [*t.all_topics(), t.batches, t.fleet, t.summaries, t.provider_batches, t.state_changelog]


@pytest.mark.parametrize("t", [topology(), topology("acme"), topology("llm", "team-a")])
def test_the_worker_reads_writes_and_creates_every_topic_of_its_deployment_and_faust_s_own(t: Topology) -> None:
    plan = acl_plan(t)
    for name in [*pipeline_topics(t), f"{t.app_id}-__assignor-__leader"]:
        for operation in ("Read", "Write", "Create", "Describe"):
            assert permits(plan, WORKER, operation, TOPIC, name), (operation, name)
    assert permits(plan, WORKER, "Read", GROUP, t.app_id)
    assert permits(plan, WORKER, "Read", GROUP, f"{t.app_id}.sink")
    assert permits(plan, WORKER, "IdempotentWrite", ResourceType.CLUSTER, CLUSTER.name)


@pytest.mark.parametrize("t", [topology(), topology("acme")])
def test_no_pipeline_principal_reaches_another_deployment(t: Topology) -> None:
    plan = acl_plan(t)
    other = topology("other")
    for user in (WORKER, SUBMITTER, SINK):
        for name in pipeline_topics(other):
            assert not permits(plan, user, "Describe", TOPIC, name), (user, name)
        assert not permits(plan, user, "Describe", GROUP, other.app_id)
    assert not any(grant.resource.name == "*" for grant in plan if grant.user != ADMIN)


def test_the_submitter_sends_reads_outcomes_and_watches_the_group_but_never_acts_as_a_worker() -> None:
    t, plan = topology(), acl_plan(topology())
    for name in pipeline_topics(t):  # ensure_pipeline_topics
        assert permits(plan, SUBMITTER, "Create", TOPIC, name) and permits(plan, SUBMITTER, "Describe", TOPIC, name)
    for name in t.request_topics:  # every priority's (submit writes each request on its priority's topic)
        assert permits(plan, SUBMITTER, "Write", TOPIC, name), name
        assert not permits(plan, SUBMITTER, "Read", TOPIC, name), name
    assert permits(plan, SUBMITTER, "Write", TOPIC, t.batches) and permits(plan, SUBMITTER, "Read", TOPIC, t.batches)
    for name in [t.results, t.state_changelog, *(t.failed(layer) for layer in FailureLayer)]:
        assert permits(plan, SUBMITTER, "Read", TOPIC, name), name
    assert permits(plan, SUBMITTER, "Describe", GROUP, t.app_id)
    assert permits(plan, SUBMITTER, "Describe", GROUP, f"{t.app_id}.sink")  # lag --group
    assert permits(plan, SUBMITTER, "IdempotentWrite", ResourceType.CLUSTER, CLUSTER.name)

    assert not permits(plan, SUBMITTER, "Write", TOPIC, t.results)
    assert not permits(plan, SUBMITTER, "Write", TOPIC, t.state_changelog)
    assert not permits(plan, SUBMITTER, "Write", TOPIC, t.provider_batches)  # only workers create provider batches
    assert not permits(plan, SUBMITTER, "Read", TOPIC, t.requests)
    assert not permits(plan, SUBMITTER, "Write", TOPIC, t.retry(t.tiers[0]))
    assert not permits(plan, SUBMITTER, "Read", GROUP, t.app_id)  # cannot join or move the workers' offsets
    assert not permits(plan, SUBMITTER, "Read", GROUP, f"{t.app_id}.sink")


def test_the_sink_reads_outcomes_in_its_own_group_and_writes_nothing() -> None:
    t, plan = topology("acme"), acl_plan(topology("acme"))
    for name in [t.results, t.dead_letters, *(t.failed(layer) for layer in FailureLayer)]:
        assert permits(plan, SINK, "Read", TOPIC, name), name
    assert permits(plan, SINK, "Read", GROUP, "acme.streamproc.sink")
    assert permits(plan, SINK, "Read", GROUP, "acme.streamproc.sink-2")
    assert not permits(plan, SINK, "Read", GROUP, t.app_id)
    assert not permits(plan, SINK, "Read", TOPIC, t.requests)
    assert not any(permits(plan, SINK, "Write", TOPIC, name) for name in pipeline_topics(t))
    assert not permits(plan, SINK, "IdempotentWrite", ResourceType.CLUSTER, CLUSTER.name)


def test_plan_lines_read_as_principal_allow_operations_resource() -> None:
    lines = [" ".join(line.split()) for line in plan_lines(acl_plan(topology()))]
    assert "User:worker ALLOW Read,Write,Create,Describe Topic:PREFIXED:llm." in lines
    assert "User:worker ALLOW Read,Describe Group:LITERAL:streamproc" in lines
    assert "User:sink ALLOW Read,Describe Group:PREFIXED:streamproc.sink" in lines
    assert "User:worker ALLOW IdempotentWrite Cluster:LITERAL:kafka-cluster" in lines
    raw = plan_lines(acl_plan(topology()))
    assert len({line.index("ALLOW") for line in raw}) == 1  # aligned columns
    assert Grant(WORKER, ("Read",), Resource(TOPIC, "x", PatternType.PREFIXED)).line() == \
        "User:worker  ALLOW  Read  Topic:PREFIXED:x"


def test_acl_command_calls_add_exactly_the_plan() -> None:
    plan = acl_plan(topology())
    wanted = {(g.user, op, g.resource) for g in plan for op in g.operations}
    calls = acl_command_calls(plan)
    added = {(user, op, resource) for call in calls for user in call.users for op in call.operations
             for resource in call.resources}
    assert added == wanted
    assert len(calls) < len(plan)
    for call in calls:
        assert len({(r.type, r.pattern) for r in call.resources}) == 1
        args = call.arguments()
        assert args[:2] == ["--add", "--force"]
        assert args[-2:] == ["--resource-pattern-type", call.resources[0].pattern.lower()]
        if call.resources[0].type is ResourceType.CLUSTER:
            assert "--cluster" in args and "--topic" not in args


def test_the_sink_group_prefix_follows_the_app_id() -> None:
    assert sink_group_prefix(topology("acme")) == "acme.streamproc.sink"
    assert sink_group_prefix(topology("llm", "team-a")) == "team-a.sink"
