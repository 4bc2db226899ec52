"""JSON-Schema validation of answers off the event loop, with a deadline (design §2, L3 row).

jsonschema checks a ``pattern`` with ``re``, which backtracks: ``^(a+)+$`` against forty ``a`` and a ``!``
runs for minutes, and inline it would stall every call of the worker. So a request that asks for a schema has
its answer validated in a small pool of child processes (:mod:`streamproc.llm.schema_worker`, started on first
use); one that passes :data:`DEADLINE_S` is killed and replaced, and the request ends business
``invalid_json_schema`` (its schema is the cause, a retry would stall again). A process because a thread cannot
be stopped; no ``regex`` module with timeouts because jsonschema calls ``re`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from streamproc.core.outcome import Failure, Outcome, Success, truncate
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.completion import check_completion, check_format, wants_schema
from streamproc.llm.schema_worker import READY

log = logging.getLogger(__name__)

DEADLINE_S = 1.0  # per answer; a real schema validates in milliseconds
WORKERS = 2
START_TIMEOUT_S = 60.0  # a child imports jsonschema before it says it is ready
LINE_LIMIT = 1 << 20  # replies are one short line


class _Worker:
    """One child process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamproc.llm.schema_worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=LINE_LIMIT)
        worker = cls(process)
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        except BaseException:
            worker.kill()
            raise
        if line.decode(errors="replace").strip() != READY:
            worker.kill()
            raise OSError(f"the schema check process did not start (it said {line[:200]!r})")
        return worker

    async def check(self, content: str, response_format: Any, deadline_s: float) -> Failure | None:
        """The problem the child finds; TimeoutError past ``deadline_s``, EOFError when it died."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([content, response_format]).encode() + b"\n")
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), deadline_s)
        if not line:
            raise EOFError("the schema check process ended")
        reply = json.loads(line)
        if reply is None:
            return None
        layer, code, message = reply
        return Failure(FailureLayer(layer), code, truncate(message), 200)

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, RuntimeError):  # gone already, or its loop is closed
                self.process.kill()


class SchemaChecks:
    """A pool of up to ``workers`` child processes; each check has one to itself, for ``deadline_s`` at most."""

    def __init__(self, workers: int = WORKERS, deadline_s: float = DEADLINE_S) -> None:
        self._workers = workers
        self._deadline_s = deadline_s
        self._idle: list[_Worker] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reaping: set[asyncio.Task[int]] = set()
        self.timed_out = 0  # checks stopped at the deadline (read by tests)

    def _bind(self) -> asyncio.Semaphore:
        """Pipes belong to a loop: a new loop (a test's) starts with fresh children."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()
            self._loop, self._slots = loop, asyncio.Semaphore(self._workers)
        return self._slots

    async def check(self, content: str, response_format: Any) -> Failure | None:
        """The answer's problem with the schema, or None; never raises but for cancellation."""
        async with self._bind():
            for tries_left in (1, 0):
                try:
                    worker = self._idle.pop() if self._idle else await _Worker.start()
                except (OSError, TimeoutError) as exc:
                    log.warning("schema checks run inline, no child process could start: %s", exc)
                    return check_format(content, response_format)
                healthy = False
                try:
                    problem = await worker.check(content, response_format, self._deadline_s)
                    healthy = True
                    return problem
                except TimeoutError:
                    self.timed_out += 1
                    return Failure(FailureLayer.BUSINESS, "invalid_json_schema", truncate(
                        f"validating the answer against response_format.json_schema.schema took over "
                        f"{self._deadline_s:g} s (a pattern that backtracks?): stopped, not called again"), 200)
                except (OSError, EOFError, ValueError) as exc:
                    if not tries_left:
                        return Failure(FailureLayer.BUSINESS, "invalid_json_schema", truncate(
                            f"the schema check's process failed twice on this answer: {type(exc).__name__}: "
                            f"{exc}"), 200)
                finally:
                    if healthy:
                        self._idle.append(worker)
                    else:
                        self._retire(worker)
        return None  # not reached: the loop returns

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        task = asyncio.get_running_loop().create_task(worker.process.wait())
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        """Stop the children and wait for them (their pipes belong to this loop)."""
        for worker in self._idle:
            self._retire(worker)
        self._idle.clear()
        if self._reaping:
            await asyncio.wait(self._reaping)


SCHEMA_CHECKS = SchemaChecks()


async def checked_completion(body: bytes, request_body: Mapping[str, Any],
                             checks: SchemaChecks = SCHEMA_CHECKS) -> Outcome:
    """:func:`~streamproc.llm.completion.check_completion`, with a schema validated in ``checks``."""
    if not wants_schema(request_body):
        return check_completion(body, request_body)
    outcome = check_completion(body, request_body, validate_schema=False)
    if not isinstance(outcome, Success):
        return outcome
    problem = await checks.check(outcome.content, request_body.get("response_format"))
    return outcome if problem is None else problem
