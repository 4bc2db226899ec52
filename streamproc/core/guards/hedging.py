"""Hedged calls: a call slower than almost all of its model's is sent once more, and the first answer wins.

A hang (a server that never answers one call) costs a whole timeout, and the timeout must stay a few times
the p99 so that healthy slow answers are not cut. "The Tail at Scale" (Dean and Barroso, 2013) answers this
with hedged requests: once a call has run longer than the p99 of its model's recent successes (scaled like
the timeout by its completion budget), a second copy is sent and whichever answers first is used; the other
is cancelled. A hang then costs about the p99 instead of three times it.

Hedges are extra load, so they are rationed like gRPC's retry throttling: every call earns ``ratio`` of a
hedge, up to ``burst`` saved, and a hedge spends one. With ``ratio`` 0.03, hedges are at most ~3 % of
calls, however slow the server gets: an overloaded server (every call slow) is not sent twice the load.
With at most ``FREE_IN_FLIGHT`` calls of the model in flight, a hedge spends nothing: a copy of one of them
cannot double a load, and the last calls of a batch, the ones its end waits for, come when the hedges the
batch earned were spent on its slow calls (a hang there cost a whole timeout).

A hedge goes only when it can help: once the calls sent before the slow one to its model were answered
(:mod:`own_queue`: before that its answer is due after theirs, and a copy would wait behind them too). It
goes through the rate limiter like any call: charged to the model's buckets (the calls after it wait that
much longer, so the pace holds), though not made to wait, and never while the model is paused by congestion.
"""

from __future__ import annotations

HEDGE_FLOOR_S = 1.0  # never hedge sooner: a call this fast was not in the tail (a loaded client adds that much)
FREE_IN_FLIGHT = 2  # with this few calls of a model in flight, a hedge costs no saved one


class HedgeBudget:
    """Tokens for hedges: each call adds ``ratio`` (at most ``burst`` kept), a hedge takes one."""

    def __init__(self, ratio: float = 0.03, burst: float = 5.0) -> None:
        if not 0 <= ratio <= 1:
            raise ValueError(f"ratio must be in [0, 1], got {ratio}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self._ratio = ratio
        self._burst = burst
        self._tokens = burst if ratio > 0 else 0.0

    def on_call(self) -> None:
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def available(self, in_flight: int) -> bool:
        """Whether a hedge may go with ``in_flight`` calls of its model in flight (ask before asking anything else
        that a hedge costs): one is saved, or they are few. Never at ratio 0 (hedging off)."""
        return self._ratio > 0 and (in_flight <= FREE_IN_FLIGHT or self._tokens >= 1)

    def take(self, in_flight: int) -> bool:
        """Spend one hedge if one is saved; none with at most ``FREE_IN_FLIGHT`` calls in flight."""
        if not self.available(in_flight):
            return False
        if in_flight > FREE_IN_FLIGHT:
            self._tokens -= 1
        return True


def hedge_after_s(tail_s: float | None) -> float | None:
    """When a call that has not answered is hedged: after its model's tail latency (None: not known yet, so
    no hedge), never sooner than :data:`HEDGE_FLOOR_S`."""
    return None if tail_s is None else max(HEDGE_FLOOR_S, tail_s)
