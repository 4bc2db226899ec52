"""Schema validation runs in child processes with a deadline: a backtracking ``pattern`` ends business
``invalid_json_schema`` while the event loop keeps serving (real child processes, no mocks)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.schema_check import SchemaChecks, checked_completion


def completion(content: str) -> bytes:
    return json.dumps({"model": "m", "choices": [{"message": {"role": "assistant", "content": content},
                                                  "finish_reason": "stop"}]}).encode()


def asking(schema: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


CATASTROPHIC = asking({"type": "object", "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}}})
HOSTILE_ANSWER = json.dumps({"word": "a" * 40 + "!"})


@pytest.fixture
async def checks() -> AsyncIterator[SchemaChecks]:
    pool = SchemaChecks(workers=2, deadline_s=1.0)
    yield pool
    await pool.close()


async def test_a_backtracking_pattern_ends_business_while_the_loop_keeps_ticking(checks: SchemaChecks) -> None:
    await checked_completion(completion('{"word": "aaa"}'), CATASTROPHIC, checks)  # children started
    ticks: list[float] = []

    async def timer() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    ticking = asyncio.create_task(timer())
    started = time.monotonic()
    outcome, other = await asyncio.gather(
        checked_completion(completion(HOSTILE_ANSWER), CATASTROPHIC, checks),
        checked_completion(completion('{"word": "b"}'), CATASTROPHIC, checks))  # served meanwhile
    took = time.monotonic() - started
    ticking.cancel()
    assert isinstance(outcome, Failure)
    assert (outcome.layer, outcome.code) == (FailureLayer.BUSINESS, "invalid_json_schema")
    assert "took over 1 s" in outcome.message and "pattern" in outcome.message
    assert isinstance(other, Failure) and other.code == "schema_mismatch"  # "b" does not match ^(a+)+$
    assert 1.0 <= took < 5.0 and checks.timed_out == 1
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    assert len(ticks) >= 15 and max(gaps) < 0.5, gaps  # the loop never stalled
    # the stuck child was replaced: the next check answers at once
    assert await checked_completion(completion('{"word": "aaaa"}'), CATASTROPHIC, checks) == Success(
        '{"word": "aaaa"}', "m", 0, 0)


async def test_answers_without_a_schema_never_reach_a_child(checks: SchemaChecks) -> None:
    plain = {"model": "m", "messages": [], "response_format": {"type": "json_object"}}
    assert isinstance(await checked_completion(completion("[1]"), plain, checks), Failure)
    assert await checked_completion(completion('{"a": 1}'), plain, checks) == Success('{"a": 1}', "m", 0, 0)
    assert checks._idle == []  # no child was started


async def test_a_broken_schema_and_a_mismatch_keep_their_codes(checks: SchemaChecks) -> None:
    broken = await checked_completion(completion('{"a": 1}'), asking({"type": 5}), checks)
    assert isinstance(broken, Failure) and (broken.layer, broken.code) == (FailureLayer.BUSINESS,
                                                                          "invalid_json_schema")
    mismatch = await checked_completion(completion('{"a": 1}'), asking({"required": ["b"]}), checks)
    assert isinstance(mismatch, Failure) and mismatch.code == "schema_mismatch" and mismatch.http_status == 200
    cut = await checked_completion(completion('{"a": '), asking({"required": ["b"]}), checks)
    assert isinstance(cut, Failure) and cut.code == "truncated"


async def test_a_child_that_dies_is_replaced(checks: SchemaChecks) -> None:
    schema = asking({"type": "object"})
    assert isinstance(await checked_completion(completion('{"a": 1}'), schema, checks), Success)
    [child] = checks._idle
    child.process.kill()
    await child.process.wait()
    assert isinstance(await checked_completion(completion('{"a": 1}'), schema, checks), Success)
