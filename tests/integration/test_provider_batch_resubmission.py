"""A 2,000-request batch over the provider-batch route on the real broker and the real mock (issue 31): the mock's
realistic faults on the lines, its 2nd provider batch expiring half-done and its 3rd failing validation, and the worker
SIGKILLed while batches are open. Every request ends in exactly one place; a member is resubmitted only when its line
failed (an error line, a 200 whose content fails the checks, a line the expiry left unrun, a batch that failed
validation), once per failed attempt; no provider batch is created twice. The provider's side is read from the mock:
every batch it holds, its input file, its output and error files."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamproc.core.provider_batch_takeover import GATHER_METADATA_KEY, RecordState
from streamproc.core.vocabulary import FailureLayer
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.integration.provider_batch_rig import batch_records, ended_once, synchronous_calls

pytestmark = pytest.mark.integration

REQUESTS = 2000
BATCH_SECONDS = 10  # how long the mock keeps a provider batch in_progress
EXPIRING, INVALID = 2, 3  # the mock's 2nd OpenAI batch expires with half its lines answered, its 3rd fails validation
# a retry budget for this batch's failures: a 250-line batch refused whole, ~125 lines left unrun by the expiry and the
# realistic faults (~150) come within seconds, when only the first few batches' attempts are tallied, so a ratio of
# them (0.2, even 0.5) ends the expired lines retry_budget_exhausted: the floor covers them
ROUTED = {"model_routes": '{"mock-small": "provider-batch"}', "provider_batch_max_requests": "250",
          "provider_batch_max_age_s": "2", "provider_batch_poll_s": "0.5", "in_flight": "1000",
          "retry_budget_min": "700"}
_ITEM = re.compile(r"Summarise item (\d+) of the test batch\.")


@dataclass(frozen=True)
class Line:
    """One member's line in one provider batch, as the mock wrote it: 200, another status, or an error code."""

    batch: int  # 1-based, in creation order
    status: str


async def provider_lines(url: str) -> tuple[list[dict[str, Any]], dict[str, list[Line]]]:
    """Every OpenAI batch the mock holds (oldest first) and, per request id, its lines in them."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        batches: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = (await client.get("/batches", params={"limit": 100} | ({"after": after} if after else {}))).json()
            batches += page["data"]
            if not page["has_more"]:
                break
            after = page["data"][-1]["id"]
        batches.reverse()
        lines: dict[str, list[Line]] = defaultdict(list)
        for number, batch in enumerate(batches, start=1):
            members = {}
            for raw in (await client.get(f"/files/{batch['input_file_id']}/content")).text.splitlines():
                line = json.loads(raw)
                match = _ITEM.search(line["body"]["messages"][0]["content"])
                assert match is not None
                members[line["custom_id"]] = f"pb-{match.group(1)}"
            statuses = {custom_id: "batch_failed" for custom_id in members}  # a failed batch has no lines
            for file_key in ("output_file_id", "error_file_id"):
                if batch.get(file_key):
                    for raw in (await client.get(f"/files/{batch[file_key]}/content")).text.splitlines():
                        line = json.loads(raw)
                        response = line["response"]
                        statuses[line["custom_id"]] = (str(response["status_code"]) if response
                                                       else line["error"]["code"])
            for custom_id, request_id in members.items():
                lines[request_id].append(Line(number, statuses[custom_id]))
        return batches, lines


async def test_2000_requests_resubmit_only_what_expired_or_failed(settings: Settings, tmp_path: Path) -> None:
    started = time.monotonic()
    # the SIGKILL must find the first provider batches still running: on a loaded machine the loop below has
    # taken several seconds to see them open, and a kill after a batch's outcomes were written but before its
    # record was closed is the crash window of design §8, not the takeover this test is about
    mock = start_mock("realistic", 31, "--batch-seconds", str(BATCH_SECONDS),
                      "--batch-fault", f"{EXPIRING}:expire=0.5", "--batch-fault", f"{INVALID}:invalid")
    first = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "first.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2", **ROUTED), tmp_path / "second.log")
    requests = [chat_request(f"pb-{i}", i) for i in range(REQUESTS)]
    ids = [r.request_id for r in requests]
    first.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # kill it while provider batches are open, the two forced ones made
            records = await batch_records(settings)
            if sum(1 for r in records.values() if r.state is RecordState.OPEN) >= INVALID + 1:
                break
            await asyncio.sleep(0.3)
        else:
            pytest.fail(f"no provider batches open in time: {first.log_tail()}")
        first.signal(signal.SIGKILL)
        killed_ms = time.time_ns() // 1_000_000
        first.process.wait(10)  # type: ignore[union-attr]
        second.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 200, second)
        stats = mock.stats(detail=True)
        batches, lines = await provider_lines(mock.url)
        await asyncio.sleep(1)
        left = await batch_records(settings)
        assert second.alive(), second.log_tail()
    finally:
        second.stop()
        first.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [], second.log_tail()
    twice = ended_once(outcomes, ids)
    # each outcome with when it was decided, in ms after the SIGKILL: a negative one was the killed worker's (design
    # §4: a kill between an outcome and its state's changelog write repeats the outcome; §8 tells what was seen)
    assert twice == [], [(i, [r.completed_ms - killed_ms for r in outcomes.results.get(i, [])], lines.get(i),
                          [(e.layer, e.error_code, e.attempt, e.terminal, e.last_failure_ms - killed_ms)
                           for e in outcomes.failures.get(i, [])])
                         for i in twice[:4]]
    assert synchronous_calls(stats) == 0
    assert left == {}
    # no provider batch created twice: one per gather, the mock's count is its list
    gathers = [b["metadata"][GATHER_METADATA_KEY] for b in batches]
    assert len(gathers) == len(set(gathers)) == stats["batches"]["openai"]["created"]
    assert "taking over provider batch" in second.log_path.read_text()
    # the forced two happened
    assert batches[EXPIRING - 1]["status"] == "expired" and batches[INVALID - 1]["status"] == "failed"
    # resubmitted only when its line failed: each line but a member's last is one failed attempt written (a 200 line
    # whose content failed the checks is a semantic failure, as a call's would be); a business line never comes back
    written = {i: len({e.attempt for e in outcomes.failures.get(i, []) if not e.terminal}) for i in lines}
    unexplained = {i: ls for i, ls in lines.items() if len(ls) - 1 != written[i]}
    # a taken-over provider batch's line answers only the attempt its member was gathered for (design §8): a member
    # of the batch refused by validation whose failure the killed worker had written is not refused twice
    assert unexplained == {}, {i: (ls, written[i]) for i, ls in list(unexplained.items())[:4]}
    answered_again = {i: ls for i, ls in lines.items() if any(line.status == "200" for line in ls[:-1])
                      and not any(e.layer is FailureLayer.SEMANTIC for e in outcomes.failures[i])}
    assert answered_again == {}
    business_again = {i: ls for i, ls in lines.items() if any(line.status == "400" for line in ls[:-1])}
    assert business_again == {}
    in_expiring = {i: ls for i, ls in lines.items() if any(line.batch == EXPIRING for line in ls)}
    unrun = [i for i, ls in in_expiring.items() if any(ln.status == "batch_expired" for ln in ls)]
    assert 0 < len(unrun) < len(in_expiring)  # half-done: some answered, the rest left unrun
    not_resubmitted = {i: (lines[i], [(e.layer, e.error_code, e.attempt, e.terminal) for e in outcomes.failures[i]])
                       for i in unrun if lines[i][-1].batch <= EXPIRING}
    assert not_resubmitted == {}  # the unrun lines went into a later batch
    failed_members = [i for i, ls in lines.items() if any(ln.batch == INVALID for ln in ls)]
    assert failed_members and all(lines[i][-1].batch > INVALID for i in failed_members)
    assert set(lines) == set(ids)  # every request went through a provider batch
    assert all(outcomes.results.get(i) for i in unrun + failed_members if lines[i][-1].status == "200")
    resubmitted = sum(len(ls) - 1 for ls in lines.values())
    # how close the kill came to outcomes being written: those decided in the second before it
    decided = [r.completed_ms for rs in outcomes.results.values() for r in rs] + [
        e.last_failure_ms for es in outcomes.failures.values() for e in es]
    print(f"\n{REQUESTS} requests: {len(batches)} provider batches, {resubmitted} resubmitted lines, "
          f"{sum(1 for i in ids if outcomes.results.get(i))} answered, "
          f"{sum(1 for ms in decided if -1000 <= ms - killed_ms < 0)} outcomes decided in the second before the kill, "
          f"{time.monotonic() - started:.1f} s")
