"""Which deployments are out of rotation, and why: what a worker's beat says and what ``status`` shows.

A deployment is out while its circuit breaker is open or half-open, or while it is paused because its first
calls all failed alike (design §5.5, §5.10): its calls go to the model's other deployments, so the batch moves and
``status`` would otherwise show nothing of it. Each worker says in its beat which of its deployments are out and
why (the last failure that counted against its breaker, or the failure that paused it); ``status`` merges the
live workers' beats. Bounded: at most ``MAX_OUT`` deployments per beat and in the merge, reasons cut to
``MAX_REASON`` characters (a beat stays small, and a reason is free text from a failure).

A tenant paused on a model (core.guards.tenant_pauses) is out the same way, under the key ``<model> for tenant
<tenant>``: ``status`` shows it to the batches that have requests of that tenant (:func:`concerning`), with why.

Pure: the worker names its breakers' states and failures, the reader gives the beats it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

MAX_OUT: Final = 64
MAX_REASON: Final = 160
HANG_CODES: Final = frozenset({"read_timeout", "timeout", "write_timeout", "pool_timeout"})


def failure_kind(code: str, http_status: int | None) -> str:
    """What a failure that counts against a breaker says of its deployment, in a few words."""
    if http_status is not None and http_status >= 500:
        return f"HTTP {http_status} answers ({code})"
    if code in HANG_CODES:
        return f"calls that hang ({code})"
    return f"transport failures ({code})"


def out_reason(state: str, last_failure: str | None) -> str:
    """Why a deployment whose breaker is in ``state`` (open, half_open) is out."""
    why = f"circuit breaker {state}"
    if last_failure:
        why += f" after {last_failure}"
    return why[:MAX_REASON]


def paused_reason(pause_reason: str) -> str:
    """Why a paused deployment is out (``pause_reason``: the failure its first calls all gave)."""
    return f"paused: {pause_reason}"[:MAX_REASON]


FOR_TENANT: Final = " for tenant "


def tenant_key(tenant: str, model: str) -> str:
    """The key of a tenant paused on a model (a tenant has no spaces: core.tenancy)."""
    return f"{model}{FOR_TENANT}{tenant}"


def worker_out(breakers_out: Mapping[str, str], paused: Mapping[str, str],
               tenants_paused: Mapping[tuple[str, str], str] | None = None) -> dict[str, str]:
    """A worker's deployments out: those whose breaker is out, and those paused (each ``key -> pause reason``);
    then the tenants paused on a model (``(tenant, model) -> pause reason``). A deployment that is both gives its
    breaker's reason: that it fails or hangs matters before what it refused."""
    tenants = {tenant_key(tenant, model): f"tenant {tenant} paused: {reason}"[:MAX_REASON]
               for (tenant, model), reason in (tenants_paused or {}).items()}
    return {**{key: paused_reason(reason) for key, reason in paused.items()}, **breakers_out, **tenants}


def bounded(out: Mapping[str, str]) -> dict[str, str]:
    """At most ``MAX_OUT`` of a worker's deployments out (by key), reasons cut: what its beat carries."""
    return {key: out[key][:MAX_REASON] for key in sorted(out)[:MAX_OUT]}


@dataclass(frozen=True)
class DeploymentOut:
    """A deployment out at ``workers`` of the live workers, and why (the reason most of them give)."""

    deployment: str
    reason: str
    workers: int

    def as_json(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "workers": self.workers, "reason": self.reason}

    def describe(self) -> str:
        at = "1 worker" if self.workers == 1 else f"{self.workers} workers"
        return f"{self.deployment}: {self.reason} ({at})"

    @property
    def tenant(self) -> str | None:
        """The tenant this entry is about (a tenant paused on a model); None: a deployment, everyone's."""
        _, mark, tenant = self.deployment.rpartition(FOR_TENANT)
        return tenant if mark else None


def concerning(out: Iterable[DeploymentOut], tenants: Iterable[str]) -> tuple[DeploymentOut, ...]:
    """What a batch with requests of ``tenants`` is shown: every deployment out, and the pauses of its tenants."""
    mine = set(tenants)
    return tuple(entry for entry in out if entry.tenant is None or entry.tenant in mine)


def fleet_out(beats: Iterable[Mapping[str, str]]) -> tuple[DeploymentOut, ...]:
    """The deployments out at any of the live workers (each worker's ``key -> reason``), by key, at most
    ``MAX_OUT``."""
    reasons: dict[str, dict[str, int]] = {}
    for out in beats:
        for key, reason in out.items():
            counts = reasons.setdefault(key, {})
            counts[reason] = counts.get(reason, 0) + 1
    merged = []
    for key in sorted(reasons)[:MAX_OUT]:
        counts = reasons[key]
        reason = max(sorted(counts), key=lambda r: counts[r])
        merged.append(DeploymentOut(key, reason[:MAX_REASON], sum(counts.values())))
    return tuple(merged)


HEARD_WITHIN_MS: Final = 10_000  # a beat older than this, by its record's time, is a worker gone: not read


class FleetOutView:
    """The latest ``out`` of each worker whose beat said one, as records of the fleet topic are read."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, Mapping[str, str]]] = {}  # worker -> (its beat's time, its out)

    def heard(self, worker: str, at_ms: int, out: Mapping[str, str]) -> None:
        if out:
            self._latest[worker] = (at_ms, out)
        else:
            self._latest.pop(worker, None)

    def gone(self, worker: str) -> None:
        self._latest.pop(worker, None)

    def out(self, now_ms: int) -> tuple[DeploymentOut, ...]:
        """The deployments out at the workers heard within ``HEARD_WITHIN_MS``."""
        return fleet_out(out for at_ms, out in self._latest.values() if now_ms - at_ms <= HEARD_WITHIN_MS)
