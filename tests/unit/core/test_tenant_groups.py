"""Which group of requests topics a tenant's requests go on (design §5.11, tenant groups)."""

from __future__ import annotations

import zlib

from streamproc.core.tenancy import DEFAULT_TENANT
from streamproc.core.tenant_groups import pinning_problem, tenant_group


def test_one_group_puts_every_tenant_in_it() -> None:
    assert {tenant_group(t, 1, {}) for t in ("team-a", "team-b", "x" * 64)} == {0}


def test_a_tenant_is_hashed_the_same_in_every_process_and_spread_over_the_groups() -> None:
    assert tenant_group("team-b", 4, {}) == zlib.crc32(b"team-b") % 4 == 3  # not Python's salted hash()
    spread = {tenant_group(f"tenant-{i}", 4, {}) for i in range(100)}
    assert spread == {0, 1, 2, 3}


def test_a_pinned_tenant_goes_to_its_group_whatever_its_hash() -> None:
    assert tenant_group("team-a", 2, {}) == tenant_group("team-b", 2, {})  # both hash to one of two
    pinned = {"team-a": 0, "team-b": 1}
    assert (tenant_group("team-a", 2, pinned), tenant_group("team-b", 2, pinned)) == (0, 1)


def test_the_default_tenant_is_in_the_first_group_the_topic_a_producer_of_its_own_writes() -> None:
    assert tenant_group(DEFAULT_TENANT, 8, {}) == 0


def test_pins_outside_the_groups_or_moving_the_default_tenant_are_refused() -> None:
    assert pinning_problem(2, {"team-a": 0, "team-b": 1}) is None
    assert pinning_problem(2, {"team-b": 2, "team-c": -1}) == \
        "tenants ['team-b', 'team-c'] are pinned outside groups 0..1"
    assert pinning_problem(2, {DEFAULT_TENANT: 1}) == "the default tenant 'default' is always in group 0"
