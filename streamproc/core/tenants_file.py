"""What ``STREAMPROC_TENANTS_FILE`` says of each tenant: its weight and its optional quotas (design §5.11).

A JSON object or a TOML table, tenant -> either a weight (a positive number, the first form) or a table of
``weight`` (default 1), ``rpm``, ``tpm`` and ``max_cost_usd_per_day`` (each optional, positive), e.g.
``{"team-a": 3, "team-b": {"weight": 1, "rpm": 60}}``. The tenants it names are also the metric labels.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from streamproc.core.tenancy import tenant_problem
from streamproc.core.tenant_share import DEFAULT_WEIGHT, TenantWeights

_QUOTA_KEYS: Final = ("rpm", "tpm", "max_cost_usd_per_day")


class InvalidTenantsFile(ValueError):
    """A tenants file that cannot be used, and why."""


@dataclass(frozen=True)
class TenantQuota:
    """The most one tenant may use: requests and tokens per minute (per worker, or its fleet share of them: design
    §5.11) and US dollars per UTC day (the fleet's). None: no quota of that kind."""

    rpm: float | None = None
    tpm: float | None = None
    max_cost_usd_per_day: float | None = None


@dataclass(frozen=True)
class Tenants:
    """The tenants file read: weights, and the quotas of the tenants that have any."""

    weights: TenantWeights = field(default_factory=TenantWeights)
    quotas: Mapping[str, TenantQuota] = field(default_factory=dict)
    named: frozenset[str] = frozenset()


NO_TENANTS_FILE: Final = Tenants()


def parse_tenants(text: str, toml: bool) -> Tenants:
    """The tenants a tenants file names (``toml``: TOML, else JSON), or :class:`InvalidTenantsFile`."""
    try:
        loaded: object = tomllib.loads(text) if toml else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InvalidTenantsFile(f"is not {'TOML' if toml else 'JSON'}: {exc}") from None
    if not isinstance(loaded, dict):
        raise InvalidTenantsFile('must be an object of tenant -> weight or {"weight", "rpm", "tpm", '
                                 '"max_cost_usd_per_day"}, e.g. {"team-a": 3, "team-b": {"rpm": 60}}')
    weights: dict[str, float] = {}
    quotas: dict[str, TenantQuota] = {}
    for tenant, given in loaded.items():
        if (problem := tenant_problem(tenant)) is not None:
            raise InvalidTenantsFile(f"tenant {problem}")
        entry = given if isinstance(given, dict) else {"weight": given}
        unknown = sorted(set(entry) - {"weight", *_QUOTA_KEYS})
        if unknown:
            raise InvalidTenantsFile(f"{tenant!r} has unknown keys {unknown} (weight, {', '.join(_QUOTA_KEYS)})")
        weights[tenant] = _positive(tenant, "weight", entry.get("weight", DEFAULT_WEIGHT))
        limits = {key: _positive(tenant, key, entry[key]) for key in _QUOTA_KEYS if key in entry}
        if limits:
            quotas[tenant] = TenantQuota(**limits)
    return Tenants(TenantWeights(weights), quotas, frozenset(loaded))


def _positive(tenant: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidTenantsFile(f"the {key} of {tenant!r} must be a positive number, got {value!r}")
    return float(value)
