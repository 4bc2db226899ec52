"""Tenants and priorities: valid names only, defaults when none is given, headers where the value names the
default, and metric labels bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.tenancy import (
    DEFAULT_TENANCY,
    OTHER_TENANTS,
    PRIORITY_HEADER,
    TENANT_HEADER,
    InvalidTenancy,
    Tenancy,
    TenantLabels,
    priority_problem,
    tenancy_of,
    tenant_problem,
    with_headers,
)


@pytest.mark.parametrize("name", ["a", "team-a", "Team_B.eu", "0", "x" * 64])
def test_short_names_from_the_conservative_set_are_tenants(name: str) -> None:
    assert tenant_problem(name) is None


@pytest.mark.parametrize(("name", "problem"), [
    ("", "is empty"),
    ("x" * 65, "is 65 characters, over the 64-character limit (starts 'xxxxxxxxxxxxxxxxxxxx')"),
    ("-a", "'-a' is not a tenant name: letters, digits, '.', '_' and '-', starting with a letter or digit"),
    ("team a", "'team a' is not a tenant name: letters, digits, '.', '_' and '-', starting with a letter or digit"),
    ("équipe", "'équipe' is not a tenant name: letters, digits, '.', '_' and '-', starting with a letter or digit"),
    ("a\nb", "'a\\nb' is not a tenant name: letters, digits, '.', '_' and '-', starting with a letter or digit"),
])
def test_other_names_are_refused_saying_why(name: str, problem: str) -> None:
    assert tenant_problem(name) == problem


def test_priorities_are_a_fixed_vocabulary() -> None:
    assert [priority_problem(p) for p in ("high", "normal", "low")] == [None] * 3
    assert priority_problem("urgent") == "'urgent' is not a priority (one of high, normal, low)"
    assert priority_problem("HIGH") is not None


def test_nothing_given_is_the_default_tenant_at_normal_priority() -> None:
    assert tenancy_of(None, None) == DEFAULT_TENANCY == Tenancy("default", "normal")
    assert tenancy_of("team-a", None) == Tenancy("team-a", "normal")
    with pytest.raises(InvalidTenancy, match="tenant must be a string, got int"):
        tenancy_of(7, None)
    with pytest.raises(InvalidTenancy, match="priority 'soon' is not a priority"):
        tenancy_of("team-a", "soon")


def test_headers_name_what_the_value_leaves_at_the_default() -> None:
    assert with_headers(DEFAULT_TENANCY, {}) == DEFAULT_TENANCY
    assert with_headers(DEFAULT_TENANCY, {TENANT_HEADER: b"team-a", PRIORITY_HEADER: b"low"}) == \
        Tenancy("team-a", "low")
    assert with_headers(Tenancy("team-a", "high"), {TENANT_HEADER: b"team-a"}) == Tenancy("team-a", "high")


@pytest.mark.parametrize(("given", "record_headers", "reason"), [
    (Tenancy("team-a"), {TENANT_HEADER: b"team-b"}, "header x-tenant 'team-b' differs from the record's 'team-a'"),
    (DEFAULT_TENANCY, {TENANT_HEADER: b"\xff"}, "header x-tenant is not valid UTF-8"),
    (DEFAULT_TENANCY, {TENANT_HEADER: b"a b"}, "tenant 'a b' is not a tenant name"),
    (DEFAULT_TENANCY, {PRIORITY_HEADER: b"now"}, "priority 'now' is not a priority"),
    (Tenancy("bad name", "normal"), {}, "tenant 'bad name' is not a tenant name"),  # a hostile Avro value
])
def test_bad_headers_or_values_are_refused(given: Tenancy, record_headers: dict[str, bytes], reason: str) -> None:
    with pytest.raises(InvalidTenancy) as refused:
        with_headers(given, record_headers)
    assert str(refused.value).startswith(reason)


def test_metric_labels_are_the_configured_tenants_and_the_default_else_other() -> None:
    labels = TenantLabels(configured=["team-a"])
    assert [labels.label(t) for t in ("team-a", "default", "team-b")] == ["team-a", "default", OTHER_TENANTS]


@given(st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3), max_size=200), st.integers(0, 10))
def test_without_a_list_the_first_n_tenants_seen_keep_their_name(tenants: list[str], first_n: int) -> None:
    labels = TenantLabels(first_n=first_n)
    seen = [labels.label(t) for t in tenants]
    assert len(set(seen) - {OTHER_TENANTS}) <= first_n
    named = list(dict.fromkeys(tenants))[:first_n]
    assert all(label == (t if t in named else OTHER_TENANTS) for t, label in zip(tenants, seen, strict=True))
