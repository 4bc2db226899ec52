"""Three ways to run the mock: in the caller's event loop, in a background thread, or as a subprocess.

In-process is the fastest for async tests (and gives direct access to the engine); the thread suits
synchronous tests; the subprocess (``python -m streamproc mock-llm --port 0``) suits tests of other
processes and pipelines, which read the URL from the first line the command prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

from streamproc.mockllm.engine import MockEngine
from streamproc.mockllm.profiles import Overrides, Profile, customize, load_profile
from streamproc.mockllm.server import MAX_BODY_BYTES, MockLLMServer
from streamproc.processes import stop_process

LISTENING_PREFIX = "mock-llm listening on "
SHUTDOWN_TIMEOUT = 2.0  # seconds a stopping server gives in-flight answers (hangs end at once)


@dataclass
class MockLLMHandle:
    """A running in-process mock: its base URL (ending in ``/v1``) and its engine."""

    url: str
    engine: MockEngine
    server: MockLLMServer

    @property
    def root(self) -> str:
        """The URL without ``/v1``: where ``/stats``, ``/healthz`` and ``/control/*`` live."""
        return self.url.removesuffix("/v1")

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        return self.server.snapshot(detail=detail)

    def start_outage(self, seconds: float | None = None) -> None:
        self.engine.outage.switch_on(self.engine.clock(), seconds)

    def end_outage(self) -> None:
        self.engine.outage.switch_off()

    def reset(self) -> None:
        self.server.reset()


def resolve_profile(profile: Profile | str, overrides: Overrides | None = None) -> Profile:
    resolved = load_profile(profile) if isinstance(profile, str) else profile
    return customize(resolved, overrides) if overrides is not None else resolved


@contextlib.asynccontextmanager
async def running_mock_llm(
    profile: Profile | str = "clean",
    seed: int = 0,
    *,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    overrides: Overrides | None = None,
    clock: Callable[[], float] = time.monotonic,
    access_log: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> AsyncIterator[MockLLMHandle]:
    """Serve the mock in the running event loop until the block ends; port 0 picks a free port."""
    engine = MockEngine(resolve_profile(profile, overrides), seed, api_key=api_key, clock=clock)
    server = MockLLMServer(engine, max_body_bytes=max_body_bytes)
    runner = web.AppRunner(
        server.build_app(),
        handler_cancellation=True,  # a client that gives up ends its hang or its latency wait
        access_log=access_logger if access_log else None,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        yield MockLLMHandle(f"http://{shown}:{bound_port}/v1", engine, server)
    finally:
        await runner.cleanup()


class MockLLMThread:
    """The mock in a background thread with its own event loop, for synchronous code and tests.

    ``with MockLLMThread("flaky", seed=1) as mock: ... mock.url ...``
    """

    def __init__(
        self,
        profile: Profile | str = "clean",
        seed: int = 0,
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        overrides: Overrides | None = None,
    ) -> None:
        self._kwargs: dict[str, Any] = {
            "profile": profile,
            "seed": seed,
            "api_key": api_key,
            "host": host,
            "port": port,
            "overrides": overrides,
        }
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._handle: MockLLMHandle | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self._require().url

    @property
    def root(self) -> str:
        return self._require().root

    def _require(self) -> MockLLMHandle:
        if self._handle is None:
            raise RuntimeError("the mock-llm thread is not running")
        return self._handle

    def start(self, timeout: float = 10.0) -> MockLLMThread:
        self._thread = threading.Thread(target=self._run, name="mock-llm", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("mock-llm thread did not start in time")
        if self._error is not None:
            raise RuntimeError("mock-llm thread failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); a thread has nowhere else to raise
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running_mock_llm(**self._kwargs) as handle:
            self._handle = handle
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[MockLLMHandle], Any], timeout: float = 10.0) -> Any:
        """Run ``fn(handle)`` on the server's loop (the engine is not thread-safe) and return its result."""
        handle, loop = self._require(), self._loop
        assert loop is not None

        async def run() -> Any:
            return fn(handle)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = self.call(lambda h: h.stats(detail=detail))
        return result

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
        self._handle = None

    def __enter__(self) -> MockLLMThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class MockLLMProcess:
    """``python -m streamproc mock-llm --port 0 ARGS...`` as a child process; the URL is its first line.

    ``with MockLLMProcess.start("--profile", "flaky", "--seed", "7") as mock: ... mock.url ...``
    """

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process = process
        self.url = url

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    @classmethod
    def start(
        cls,
        *args: str,
        python: str = sys.executable,
        timeout: float = 20.0,
        env: Mapping[str, str] | None = None,
    ) -> MockLLMProcess:
        """Start the command (``--port 0`` unless ``args`` give a port) and wait for its URL line."""
        command: list[str] = [python, "-m", "streamproc", "mock-llm"]
        if "--port" not in args:
            command += ["--port", "0"]
        command += list(args)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=dict(env) if env else None
        )
        try:
            line = _read_first_line(process, timeout)
        except BaseException:
            _terminate(process, 5.0)
            raise
        if not line.startswith(LISTENING_PREFIX):
            _terminate(process, 5.0)
            raise RuntimeError(f"mock-llm printed {line!r} instead of its URL")
        return cls(process, line.removeprefix(LISTENING_PREFIX).strip())

    def get(self, path: str, timeout: float = 10.0) -> Any:
        with urllib.request.urlopen(self.root + path, timeout=timeout) as response:
            return json.loads(response.read())

    def post(self, path: str, body: Any, timeout: float = 10.0) -> Any:
        request = urllib.request.Request(
            self.root + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def stats(self, *, detail: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/stats?detail=1" if detail else "/stats")
        return result

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        return _terminate(self.process, timeout)

    def __enter__(self) -> MockLLMProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _read_first_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    data = b""
    fd = process.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"mock-llm did not print its URL within {timeout}s")
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                code = process.wait(timeout=5)
                raise RuntimeError(f"mock-llm exited with code {code} before printing its URL")
            data += chunk
    return data.split(b"\n", 1)[0].decode()


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> int:
    code = stop_process(process, timeout)
    if process.stdout is not None:
        process.stdout.close()
    return code
