"""``submit --deadline``: past it, a routed model's request goes by a synchronous call instead of a provider batch.

A provider batch answers within its completion window (24 h), usually much sooner but with no promise; the deadline
is how long a user will wait for the discount. It is measured from the batch's submission (the manifest's
``created_ms``) and must end before the batch's own completion window, or nothing could be called after it. A request
already held by a provider batch (its member, awaited) waits for its line even past the deadline: calling it too
would pay for it twice (design §8).
"""

from __future__ import annotations

from enum import Enum


class Way(Enum):
    """How a request's answer is asked for, which also sets its price (a provider batch's line is discounted)."""

    CALL = "call"
    PROVIDER_BATCH = "provider_batch"


def past_deadline(deadline_ms: int | None, now_ms: int) -> bool:
    """Whether the batch's deadline (None: none) has come."""
    return deadline_ms is not None and now_ms >= deadline_ms


def routed(asked: str | None, model_routed: bool) -> bool:
    """Whether a request goes by the provider-batch route: as its record asks (``submit --route``, carried on its
    retries), else as its model is routed (``STREAMPROC_MODEL_ROUTES``)."""
    return model_routed if asked is None else asked == "provider-batch"


def way_of(routed: bool, past: bool, held: bool) -> Way:
    """How a request is answered: a routed model's by its provider batch, unless its batch's deadline passed and no
    provider batch already holds it (``held``: its line is awaited, and a call beside it would be paid twice)."""
    if routed and (held or not past):
        return Way.PROVIDER_BATCH
    return Way.CALL


def deadline_problem(deadline_s: float, completion_window_s: float | None) -> str | None:
    """Why a ``--deadline`` cannot be used with the batch's ``--completion-window``, or None: a deadline at or past
    the window's end would leave no time to call what the provider batches did not answer."""
    if completion_window_s is not None and deadline_s >= completion_window_s:
        return (f"the deadline ({deadline_s:g}s) must be shorter than the completion window "
                f"({completion_window_s:g}s): past the window nothing is called")
    return None
