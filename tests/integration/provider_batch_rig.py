"""What the provider-batch route's integration tests share: the worker settings that route ``mock-small``, the
provider-batch records on the broker, a routed batch file, and the checks each test makes (every request ended once,
no synchronous call)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from streamproc.app.provider_batch_log import owned_records
from streamproc.app.topic_reader import TopicReader
from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import Outcomes, WorkerProcess

ROUTED = {"model_routes": '{"mock-small": "provider-batch"}', "provider_batch_max_age_s": "2",
          "provider_batch_poll_s": "0.5", "in_flight": "200"}


def ended_once(outcomes: Outcomes, ids: list[str]) -> list[str]:
    """The ids that did not end in exactly one place (one result, or one terminal failure, never both)."""
    return [i for i in ids if len(outcomes.results.get(i, [])) + len(outcomes.terminal(i)) != 1]


async def batch_records(settings: Settings) -> dict[str, ProviderBatchRecord]:
    assert settings.kafka_bootstrap is not None
    async with TopicReader(KafkaConnection(bootstrap=settings.kafka_bootstrap),
                           [settings.topology().provider_batches]) as reader:
        return await owned_records(reader, range(settings.partitions), lambda why: None)


async def wait_all_open(settings: Settings, count: int, worker: WorkerProcess,
                        timeout_s: float = 90) -> dict[str, ProviderBatchRecord]:
    """The provider-batch records once ``count`` requests are members of open provider batches."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = await batch_records(settings)
        if sum(len(r.members) for r in records.values() if r.state is RecordState.OPEN) == count:
            return records
        await asyncio.sleep(0.5)
    pytest.fail(f"the batches were not all open in time: {worker.log_tail()}")


def synchronous_calls(stats: dict[str, Any]) -> int:
    """The mock's answers that were no line of a provider batch (it counts both as calls)."""
    calls: int = stats["calls"] - stats["batches"]["openai"]["lines_answered"]
    return calls


def routed_batch_file(path: Path, count: int, prefix: str = "doomed", model: str = "mock-small") -> Path:
    """An OpenAI Batch input file of ``count`` chat requests to ``model`` (``mock-small`` is the routed one)."""
    with open(path, "w") as out:
        for i in range(count):
            body = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": f"Q{i}?"}]}
            out.write(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": body}) + "\n")
    return path
