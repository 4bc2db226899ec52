"""``submit --route`` (design §8): one file submitted twice against a worker whose models are not routed, once
``--route provider-batch`` (every request answered by a provider batch, none by a call, at half the price) and
once ``--route call`` against a worker that routes the model (every request called, no provider batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, start_mock, worker_env
from tests.integration.provider_batch_rig import ROUTED, routed_batch_file, synchronous_calls
from tests.integration.test_operations import cli, status_of, wait_converged

pytestmark = pytest.mark.integration

COUNT = 40
NOT_ROUTED = {key: value for key, value in ROUTED.items() if key != "model_routes"}


@pytest.mark.parametrize(("route", "worker_settings"), [("provider-batch", NOT_ROUTED), ("call", ROUTED)])
def test_submit_route_overrides_the_models_route(settings: Settings, tmp_path: Path, route: str,
                                                 worker_settings: dict[str, str]) -> None:
    batch = f"by-{route}"
    submitted = cli(settings, "submit", str(routed_batch_file(tmp_path / "in.jsonl", COUNT, prefix=batch)),
                    "--batch-id", batch, "--route", route)
    assert submitted.returncode == 0, submitted.stderr
    mock = start_mock("clean", 3)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **worker_settings),
                           tmp_path / "worker.log")
    worker.start()
    try:
        final = wait_converged(settings, batch, 120, worker)[-1]
        stats = mock.stats(detail=True)
    finally:
        worker.stop()
        mock.stop()

    assert final["succeeded"] == COUNT, final
    batches = stats["batches"]["openai"]
    if route == "provider-batch":
        assert batches["created"] >= 1 and batches["lines_answered"] == COUNT
        assert synchronous_calls(stats) == 0
    else:
        assert batches["created"] == 0
        assert stats["calls"] == COUNT
    assert status_of(settings, batch)["submitted"] == COUNT
