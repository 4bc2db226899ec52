"""The tenants file: weights and quotas (core/tenants_file.py)."""

from __future__ import annotations

import pytest

from streamproc.core.tenants_file import InvalidTenantsFile, TenantQuota, parse_tenants


def test_weights_from_json_and_toml() -> None:
    assert parse_tenants('{"team-a": 3, "team-b": 0.5}', toml=False).weights.of("team-a") == 3.0
    weights = parse_tenants('team-a = 3\n"team.b" = 1.5\n', toml=True).weights
    assert (weights.of("team-a"), weights.of("team.b"), weights.of("unnamed")) == (3.0, 1.5, 1.0)


def test_quotas_beside_the_weight_in_both_forms() -> None:
    tenants = parse_tenants('{"team-a": 3, "team-b": {"rpm": 60, "tpm": 9000}, '
                            '"team-c": {"weight": 2, "max_cost_usd_per_day": 5}}', toml=False)
    assert tenants.quotas == {"team-b": TenantQuota(rpm=60.0, tpm=9000.0),
                              "team-c": TenantQuota(max_cost_usd_per_day=5.0)}
    assert (tenants.weights.of("team-b"), tenants.weights.of("team-c")) == (1.0, 2.0)
    assert tenants.named == {"team-a", "team-b", "team-c"}
    toml = parse_tenants('team-a = 2\n[team-b]\nweight = 1\nrpm = 30\n', toml=True)
    assert toml.quotas == {"team-b": TenantQuota(rpm=30.0)} and toml.weights.of("team-a") == 2.0


@pytest.mark.parametrize(("text", "says"), [
    ('["a"]', "object of tenant -> weight"),
    ('{"a": 0}', "weight of 'a' must be a positive number"),
    ('{"a": true}', "positive number"),
    ('{"a": "2"}', "positive number"),
    ('{"a": {"rpm": 0}}', "rpm of 'a' must be a positive number"),
    ('{"a": {"tpm": -5}}', "tpm of 'a' must be a positive number"),
    ('{"a": {"rps": 5}}', r"unknown keys \['rps'\]"),
    ('{"bad name": 1}', "not a tenant name"),
    ("{", "is not JSON"),
])
def test_a_bad_tenants_file_says_why(text: str, says: str) -> None:
    with pytest.raises(InvalidTenantsFile, match=says):
        parse_tenants(text, toml=False)
