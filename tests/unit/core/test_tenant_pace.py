"""Per-tenant RPM/TPM quotas (core/tenant_pace.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.tenant_pace import TenantPace
from streamproc.core.tenants_file import TenantQuota


def starts_in(pace: TenantPace, tenant: str, tokens: int, seconds: float, step: float = 0.01) -> int:
    """How many calls of ``tenant`` start over ``seconds`` when each starts as soon as it may."""
    started, now = 0, 0.0
    while now < seconds:
        if pace.wait_s(tenant, tokens, now) == 0:
            pace.start(tenant, tokens, now)
            started += 1
        else:
            now += step
    return started


def test_a_tenant_s_calls_keep_to_its_rpm_and_the_others_are_not_held() -> None:
    pace = TenantPace({"slow": TenantQuota(rpm=60)})
    assert starts_in(pace, "slow", 10, 10.0) == 11  # a second's worth at once, then one a second
    assert pace.holds_back("slow", 10.0)
    assert pace.wait_s("free", 10**9, 10.0) == 0 and not pace.holds_back("free", 10.0)  # a tenant without quota


def test_the_tpm_quota_counts_each_call_s_estimate_and_a_big_call_is_repaid_before_the_next() -> None:
    pace = TenantPace({"a": TenantQuota(tpm=6000)})  # 100 tokens a second
    assert pace.wait_s("a", 1000, 0.0) == 0  # larger than the bucket: it starts once the bucket is full
    pace.start("a", 1000, 0.0)
    assert pace.wait_s("a", 50, 0.0) == pytest.approx(9.5)  # 900 of debt, then 50
    assert pace.holds_back("a", 5.0) and not pace.holds_back("a", 9.01)


def test_the_fleet_share_divides_the_quota() -> None:
    workers = [1]
    pace = TenantPace({"a": TenantQuota(rpm=120)}, share=lambda: 1 / workers[0])
    assert starts_in(pace, "a", 0, 10.0) == 2 + 20  # a second's worth, then two a second
    workers[0] = 2  # another worker joined: this one paces half from now on
    assert pace.holds_back("a", 10.0) and pace.wait_s("a", 0, 10.0) == pytest.approx(1.0, abs=0.02)


@given(st.floats(6, 600), st.floats(5, 60))
def test_no_tenant_passes_its_rpm_beyond_one_bucket(rpm: float, seconds: float) -> None:
    pace = TenantPace({"a": TenantQuota(rpm=rpm)})
    allowed = rpm / 60 * seconds + max(1.0, rpm / 60) + 1
    assert starts_in(pace, "a", 0, seconds, step=0.05) <= allowed


def test_no_quota_no_pace() -> None:
    assert not TenantPace({"a": TenantQuota(max_cost_usd_per_day=5)})  # spend is the spend gate's
    assert TenantPace({"a": TenantQuota(rpm=1)})
