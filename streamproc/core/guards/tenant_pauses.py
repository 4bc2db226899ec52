"""One tenant's systematic failures pause that tenant's calls of a model, not the model (issue 28 item 4).

A tenant whose requests all carry something the provider refuses (a parameter its integration sets wrongly, a
header, a prompt the policy refuses word for word) fails every call the same way while the model answers every
other tenant. :mod:`streamproc.core.guards.pauses` does not stop it: that model has answered, so it is never
paused, and it must not be: the others' requests would wait for one tenant's mistake. So each (tenant, model)
has its own run: once ``threshold`` of the tenant's calls of the model in a row, in the order sent
(:mod:`streamproc.core.guards.sent_order`), failed *alike* (the same HTTP status, code and message of a
non-retryable failure, as :func:`streamproc.core.guards.pauses.signature` says) **and** another tenant's call of
the same model was answered within ``witness_s``, that tenant is paused on that model: its calls are parked
(as a paused model's are) and one probe call per ``probe_interval_s`` checks whether it was fixed. An answer of
that tenant (a success, a semantic failure, a failure about its own input) ends the run and the pause.

Without the witness the failure may be the model's or the endpoint's for everyone (a model pause or an open
breaker handles that); a lone tenant is never paused by this rule. Retryable failures neither count nor clear.

Time is passed in; the caller logs, counts and parks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from streamproc.core.guards.bounded import MAX_MODELS, LruDict
from streamproc.core.guards.pauses import Pause, Signature, answered, signature
from streamproc.core.guards.sent_order import SentOrder
from streamproc.core.outcome import Outcome

ANSWERED: Final = "answered"
Ended = Signature | Literal["answered"]
Key = tuple[str, str]  # (tenant, model)
WITNESSES = 2  # per model, the tenants last answered: the newest other than any one tenant is among two


@dataclass
class _Run:
    order: SentOrder[Ended] = field(default_factory=SentOrder)
    failing_as: Signature | None = None  # the failure of the run
    repeats: int = 0
    pause: Pause | None = None


class TenantPauses:
    """Per (tenant, model) detection of failures alike while the model answers others, and the pause with its
    probes."""

    def __init__(self, threshold: int = 5, probe_interval_s: float = 30.0, witness_s: float = 60.0,
                 on_change: Callable[[str, str, Pause | None], None] | None = None) -> None:
        if threshold < 1 or not probe_interval_s > 0 or not witness_s > 0:
            raise ValueError("need threshold >= 1, probe_interval_s > 0 and witness_s > 0")
        self._threshold = threshold
        self._probe_interval_s = probe_interval_s
        self._witness_s = witness_s
        self._on_change = on_change
        # both bounded: tenants and models come from the request topic (a paused key dropped is unpaused)
        self._runs: LruDict[Key, _Run] = LruDict(MAX_MODELS, factory=_Run)
        self._answered: LruDict[str, LruDict[str, float]] = LruDict(
            MAX_MODELS, factory=lambda: LruDict(WITNESSES))  # model -> tenant -> when last answered

    def paused(self) -> dict[Key, Pause]:
        return {key: run.pause for key, run in self._runs.items() if run.pause is not None}

    def retry_at(self, tenant: str, model: str, now: float) -> float:
        """When a call of ``tenant`` to ``model`` may go: now, or its next probe while paused."""
        run = self._runs.get((tenant, model))
        return now if run is None or run.pause is None else max(now, run.pause.probe_at)

    def may_call(self, tenant: str, model: str, now: float) -> bool:
        """Whether a call may go now; while paused, True once per probe interval (that call is the probe)."""
        run = self._runs.get((tenant, model))
        if run is None or run.pause is None:
            return True
        if now < run.pause.probe_at:
            return False
        run.pause = Pause(run.pause.reason, run.pause.since, now + self._probe_interval_s)
        return True

    def begin(self, tenant: str, model: str) -> int:
        """The number of a call about to go; pass it to :meth:`record` or :meth:`abandon`."""
        return self._runs[(tenant, model)].order.begin()

    def abandon(self, tenant: str, model: str, call: int, now: float) -> None:
        """Call number ``call`` ended without an answer: it neither counts nor holds back the calls after it."""
        self._end(tenant, model, call, None, now)

    def record(self, tenant: str, model: str, outcome: Outcome, now: float, call: int) -> None:
        """Call number ``call`` (from :meth:`begin`) of ``tenant`` to ``model`` ended with ``outcome``."""
        if answered(outcome):
            self._answered[model][tenant] = now
            self._end(tenant, model, call, ANSWERED, now)
        else:
            self._end(tenant, model, call, signature(outcome), now)

    def _end(self, tenant: str, model: str, call: int, ended: Ended | None, now: float) -> None:
        run = self._runs.get((tenant, model))
        if run is None:  # dropped from the bound since it began
            return
        for due in run.order.end(call, ended):
            self._judge(tenant, model, run, due, now)

    def _judge(self, tenant: str, model: str, run: _Run, ended: Ended | None, now: float) -> None:
        """The next call in the order sent ended: answered, failed as a signature, or neither (None)."""
        if isinstance(ended, str):  # answered
            run.failing_as, run.repeats = None, 0
            if run.pause is not None:
                run.pause = None
                self._changed(tenant, model, None)
            return
        if ended is None or run.pause is not None:
            return
        if ended != run.failing_as:
            run.failing_as, run.repeats = ended, 0
        run.repeats += 1
        if run.repeats >= self._threshold and self._witnessed(tenant, model, now):
            status, code, message = ended
            run.pause = Pause(f"its last {run.repeats} calls of {model} all failed alike while other tenants' "
                              f"calls of it were answered: {code} (HTTP {status}): {message}"[:1000],
                              now, now + self._probe_interval_s)
            run.order.skip()  # the calls in flight now neither prolong nor end the pause: the probes do
            self._changed(tenant, model, run.pause)

    def _witnessed(self, tenant: str, model: str, now: float) -> bool:
        """Whether another tenant's call of ``model`` was answered within the witness window."""
        seen = self._answered.get(model)
        return seen is not None and any(other != tenant and now - at <= self._witness_s for other, at in seen.items())

    def _changed(self, tenant: str, model: str, pause: Pause | None) -> None:
        if self._on_change is not None:
            self._on_change(tenant, model, pause)
