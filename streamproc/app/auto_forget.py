"""Automatic retention (``STREAMPROC_RETAIN_FINISHED``): the workers forget the batches that finished longer ago
than that, as ``streamproc forget --finished-before`` does (design §6, forget).

One worker does it, the owner of partition 0 of the requests topic: a rebalance can give two workers that belief
for a moment, and forgetting a batch twice only writes its manifest again. Each look reads the summaries and the
manifests, not the changelog (app/forgetting): which batches finished is in the workers' summed counts, and each
worker's purge (app/table_purge) deletes and tombstones the states of a batch once its manifest says forgotten.
It runs every tenth of the retention (10 s to an hour). A failure is logged and tried again at the next look; it
never stops the worker.
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
            done = await self._forgetter.forget_finished_by_summaries(self._clock_ms() - self._retain_ms)
        except Exception:
            log.exception("automatic retention: could not forget the finished batches; trying at the next look")
            return []
        for outcome in done:
            kept = outcome.forgotten
            log.info("automatic retention: forgot batch %s, finished more than %.0f s ago (%d requests; the workers "
                     "delete their states)", outcome.batch_id, self._retain_ms / 1000,
                     0 if kept is None else kept.succeeded + sum(kept.failed.values()))
        return done
