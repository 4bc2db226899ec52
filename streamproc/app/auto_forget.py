"""Automatic retention (``STREAMPROC_RETAIN_FINISHED``): the workers forget the batches that finished longer ago
than that, as ``streamproc forget --finished-before`` does (design §6, forget).

One worker does it, the owner of partition 0 of the requests topic: a rebalance can give two workers that belief
for a moment, and forgetting a batch twice only writes its tombstones and manifest again. Each look reads the
whole changelog, so it runs every tenth of the retention (at most hourly). A failure is logged and tried again
at the next look; it never stops the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from streamproc.app.forgetting import BatchForgetter, Forgetting

log = logging.getLogger(__name__)


class AutoForget:
    """Forgets the batches that finished more than ``retain_ms`` ago, when ``leads()`` says this worker is the one."""

    def __init__(self, forgetter: BatchForgetter, retain_ms: int, leads: Callable[[], bool],
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self._forgetter = forgetter
        self._retain_ms = retain_ms
        self._leads = leads
        self._clock_ms = clock_ms

    async def run_once(self) -> list[Forgetting]:
        if not self._leads():
            return []
        try:
            done = await self._forgetter.forget_finished_before(self._clock_ms() - self._retain_ms)
        except Exception:
            log.exception("automatic retention: could not forget the finished batches; trying at the next look")
            return []
        for outcome in done:
            log.info("automatic retention: forgot batch %s, finished more than %.0f s ago (%d states removed)",
                     outcome.batch_id, self._retain_ms / 1000, outcome.states)
        return done
