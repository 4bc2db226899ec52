"""Each priority's requests topic (design §5.11, lanes): where a request is written, what the workers read."""

from __future__ import annotations

from streamproc.core.retry_policy import Tier
from streamproc.core.tenancy import PRIORITIES
from streamproc.core.topology import Topology

TIERS = (Tier("5s", 5000),)


def test_a_request_goes_on_its_prioritys_topic_and_normal_stays_on_the_requests_topic() -> None:
    t = Topology("acme", 6, TIERS)
    assert t.request_topic("high") == "acme.requests.high"
    assert t.request_topic("normal") == "acme.requests"
    assert t.request_topic("low") == "acme.requests.low"
    assert t.request_topics == ["acme.requests.high", "acme.requests", "acme.requests.low"]  # most urgent first


def test_an_unknown_priority_goes_on_the_requests_topic_where_the_handler_refuses_it() -> None:
    assert Topology("acme", 6, TIERS).request_topic("urgent") == "acme.requests"


def test_during_a_rolling_upgrade_every_request_goes_on_the_topic_the_older_workers_read() -> None:
    t = Topology("acme", 6, TIERS, by_priority=False)
    assert {t.request_topic(priority) for priority in PRIORITIES} == {"acme.requests"}
    assert "acme.requests.high" in t.inputs  # still read: records written before the upgrade began


def test_every_priority_topic_is_read_created_and_co_partitioned_with_the_others() -> None:
    t = Topology("acme", 6, TIERS)
    for topic in t.request_topics:
        assert topic in t.inputs
        assert t.all_topics()[topic] == 6  # a request's state stays on its partition, whichever topic it came by
    assert t.inputs[:3] == t.request_topics and t.inputs[3] == t.backlog


def test_tenant_groups_split_every_prioritys_topic_and_the_first_group_keeps_its_name() -> None:
    t = Topology("acme", 6, TIERS, tenant_groups=2, pinned_groups={"team-b": 1, "team-a": 0})
    assert t.request_topics == ["acme.requests.high", "acme.requests.high.g1", "acme.requests",
                                "acme.requests.g1", "acme.requests.low", "acme.requests.low.g1"]
    assert t.request_topic("normal", "team-a") == "acme.requests"
    assert t.request_topic("normal", "team-b") == "acme.requests.g1"
    assert t.request_topic("low", "team-b") == "acme.requests.low.g1"
    assert t.request_topic("high") == "acme.requests.high"  # the default tenant: the first group
    assert all(t.all_topics()[topic] == 6 for topic in t.request_topics) and t.inputs[:6] == t.request_topics


def test_during_a_rolling_upgrade_no_tenant_is_written_on_a_group_topic() -> None:
    t = Topology("acme", 6, TIERS, by_priority=False, tenant_groups=2, pinned_groups={"team-b": 1})
    assert t.request_topic("normal", "team-b") == "acme.requests"
