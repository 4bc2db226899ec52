"""Who a request is for and how urgent it is: its tenant and its priority (issue 28).

Both come from the submitter (``submit --tenant/--priority``, a JSON record's ``tenant``/``priority`` fields, or
the ``x-tenant``/``x-priority`` headers of any request record) and travel on the request event, its state, its
result and its failure events, so a scheduler can share capacity by them and every report can group by them. A
request that names neither belongs to :data:`DEFAULT_TENANT` at :data:`DEFAULT_PRIORITY`.

A tenant name becomes a metric label, a table column and a word in ``status``: so it is a short name from a
conservative set (letters, digits, ``. _ -``, starting with a letter or digit, at most
:data:`MAX_TENANT_CHARS`), and a priority is one of :data:`PRIORITIES`. Metric labels are bounded further by
:class:`TenantLabels`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

TENANT_HEADER: Final = "x-tenant"
PRIORITY_HEADER: Final = "x-priority"
DEFAULT_TENANT: Final = "default"
PRIORITIES: Final = ("high", "normal", "low")  # most urgent first
DEFAULT_PRIORITY: Final = "normal"
MAX_TENANT_CHARS: Final = 64
OTHER_TENANTS: Final = "other"  # the metric label of every tenant past the bound
_TENANT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Tenancy:
    """A request's tenant and priority, both valid."""

    tenant: str = DEFAULT_TENANT
    priority: str = DEFAULT_PRIORITY


DEFAULT_TENANCY: Final = Tenancy()


def tenant_problem(tenant: str) -> str | None:
    """Why ``tenant`` cannot name a tenant, or None."""
    if not tenant:
        return "is empty"
    if len(tenant) > MAX_TENANT_CHARS:
        return f"is {len(tenant)} characters, over the {MAX_TENANT_CHARS}-character limit (starts {tenant[:20]!r})"
    if _TENANT.fullmatch(tenant) is None:
        return (f"{tenant!r} is not a tenant name: letters, digits, '.', '_' and '-', starting with a letter or "
                "digit")
    return None


def priority_problem(priority: str) -> str | None:
    """Why ``priority`` is no priority, or None."""
    if priority in PRIORITIES:
        return None
    shown = priority if len(priority) <= 20 else f"{priority[:20]}..."
    return f"{shown!r} is not a priority (one of {', '.join(PRIORITIES)})"


class InvalidTenancy(ValueError):
    """A tenant or priority that cannot be used, and why (the caller names the line or record)."""


def tenancy_of(tenant: object, priority: object) -> Tenancy:
    """The tenancy given (None: the default of each; anything else must be a valid string), or
    :class:`InvalidTenancy` naming the first problem."""
    for name, given, problem_of in (("tenant", tenant, tenant_problem), ("priority", priority, priority_problem)):
        if given is None:
            continue
        if not isinstance(given, str):
            raise InvalidTenancy(f"{name} must be a string, got {type(given).__name__}")
        if (problem := problem_of(given)) is not None:
            raise InvalidTenancy(f"{name} {problem}")
    return Tenancy(tenant if isinstance(tenant, str) else DEFAULT_TENANT,
                   priority if isinstance(priority, str) else DEFAULT_PRIORITY)


def tenancy_headers(given: Tenancy) -> tuple[tuple[str, bytes], ...]:
    """The ``x-tenant``/``x-priority`` headers a request record carries for what is not the default: the worker's
    requests agent schedules by them without decoding the value (design §5.11)."""
    return tuple((header, value.encode()) for header, value, default in (
        (TENANT_HEADER, given.tenant, DEFAULT_TENANT), (PRIORITY_HEADER, given.priority, DEFAULT_PRIORITY))
        if value != default)


def with_headers(given: Tenancy, record_headers: Mapping[str, bytes]) -> Tenancy:
    """The tenancy of a request record: its value's, or its ``x-tenant``/``x-priority`` headers' where the value
    names the default (a producer of its own may set only headers); :class:`InvalidTenancy` when a header is no
    valid name, or names another than the value does."""
    tenant, priority = given.tenant, given.priority
    for header, default, value in ((TENANT_HEADER, DEFAULT_TENANT, tenant), (PRIORITY_HEADER, DEFAULT_PRIORITY,
                                                                              priority)):
        raw = record_headers.get(header)
        if raw is None:
            continue
        try:
            from_header = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidTenancy(f"header {header} is not valid UTF-8") from None
        if value != default and from_header != value:
            raise InvalidTenancy(f"header {header} {from_header[:70]!r} differs from the record's {value!r}; give one")
        if header == TENANT_HEADER:
            tenant = from_header
        else:
            priority = from_header
    return tenancy_of(tenant, priority)


class TenantLabels:
    """The metric label of a tenant, bounded: the configured tenants by name (when a list is given), else the first
    ``first_n`` tenants seen; every other tenant is :data:`OTHER_TENANTS`. A record's tenant comes from any producer,
    so without a bound each new name would be a new time series for as long as the worker runs."""

    def __init__(self, configured: Iterable[str] = (), first_n: int = 20) -> None:
        self._configured = frozenset(configured)
        self._first_n = first_n
        self._seen: set[str] = set()

    def label(self, tenant: str) -> str:
        if self._configured:
            return tenant if tenant in self._configured or tenant == DEFAULT_TENANT else OTHER_TENANTS
        if tenant in self._seen:
            return tenant
        if len(self._seen) < self._first_n:
            self._seen.add(tenant)
            return tenant
        return OTHER_TENANTS
