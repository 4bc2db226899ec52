"""Automatic retention (app.auto_forget): only the leading worker forgets, what finished before now - retention."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streamproc.app.auto_forget import AutoForget
from streamproc.app.forgetting import BatchForgetter, Forgetting


class FakeForgetter:
    def __init__(self, fails: bool = False) -> None:
        self.cutoffs: list[int] = []
        self._fails = fails

    async def forget_finished_by_summaries(self, cutoff_ms: int) -> list[Forgetting]:
        self.cutoffs.append(cutoff_ms)
        if self._fails:
            raise OSError("broker gone")
        return [Forgetting("old", 12)]


def auto(forgetter: FakeForgetter, leads: list[bool]) -> AutoForget:
    fake: BatchForgetter = forgetter  # type: ignore[assignment]
    return AutoForget(fake, retain_ms=1_000, leads=lambda: leads[0], clock_ms=lambda: 10_000)


def test_only_the_leading_worker_forgets_what_finished_longer_ago_than_the_retention() -> None:
    forgetter, leads = FakeForgetter(), [False]
    retention = auto(forgetter, leads)
    assert asyncio.run(retention.run_once()) == [] and forgetter.cutoffs == []
    leads[0] = True
    assert asyncio.run(retention.run_once()) == [Forgetting("old", 12)]
    assert forgetter.cutoffs == [9_000]


def test_a_failed_look_is_logged_and_the_worker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert asyncio.run(auto(FakeForgetter(fails=True), [True]).run_once()) == []
    assert "could not forget the finished batches" in caplog.text
