"""What carries the LLM client's POSTs (``STREAMPROC_LLM_HTTP``): aiohttp's client, or httpx on httpcore.

Both send the same JSON bytes and give back the status, headers and body; their exceptions are classified
into the same codes (:mod:`streamproc.llm.transport_errors`). aiohttp is the default because it costs a
fraction of the CPU per call (measured against the mock at 256 in flight: 309 µs against httpx's 1,411 µs
on httpcore and 602 µs on aiohttp through httpx-aiohttp; README, Benchmarks). httpx stays for tests, whose
mock transports replace the network, and as ``STREAMPROC_LLM_HTTP=httpcore``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import httpx
from yarl import URL

from streamproc.settings import Settings

# httpcore 1.0's pool does work proportional to its connections each time a request starts or ends, and to
# the square of its idle connections (``_assign_requests_to_connections`` counts the idle ones once per idle
# connection): one pool of 256 connections costs ~10 ms of CPU per call and starves the event loop well
# below 256 calls in flight. Pools of at most this many connections, the least busy chosen per call, bound
# the total the same way at a small fraction of that cost. They share one TLS context (each would otherwise
# load the CA bundle: ~50 ms and ~1 MB apiece). aiohttp's connector has no such cost: one pool of them all.
POOL_SHARD_SIZE = 8


@dataclass(frozen=True)
class Answer:
    """What came back: any status, the headers (case-insensitive), the raw body."""

    status: int
    headers: Mapping[str, str]
    content: bytes


class HttpStack(Protocol):
    """POSTs JSON to ``{base_url}{path}``; raises what its library raises (classified by the caller)."""

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str], read_timeout_s: float) -> Answer: ...

    async def aclose(self) -> None: ...


def http_stack(settings: Settings, headers: dict[str, str],
               transport: httpx.AsyncBaseTransport | None = None) -> HttpStack:
    """``settings.llm_http``'s stack with ``settings.in_flight`` connections; a given httpx transport (tests)
    means httpx."""
    if transport is None and settings.llm_http == "aiohttp":
        return AiohttpStack(settings, headers)
    return HttpxPools(settings, headers, transport)


_WIRE_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)  # one, not one per call


def json_bytes(body: dict[str, Any]) -> bytes:
    """The body as httpx's ``json=`` writes it (compact, UTF-8; NaN refused), for either stack."""
    return _WIRE_JSON.encode(body).encode()


def env_proxy(url: str) -> str | None:
    """The proxy ``HTTP(S)_PROXY`` names for the URL's scheme unless ``NO_PROXY`` exempts its host, as httpx
    honours them. Read once: aiohttp's ``trust_env`` reads them, and ``~/.netrc``, in a thread on every
    request (a third of the worker's CPU under the CPU-bound benchmark)."""
    parts = urlsplit(url)
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


class AiohttpStack:
    """One aiohttp session (made at the first call: it needs the running loop), ``in_flight`` connections."""

    def __init__(self, settings: Settings, headers: dict[str, str]) -> None:
        self._base = (settings.llm_base_url or "").rstrip("/")
        self._headers = {**headers, "content-type": "application/json"}
        self._limit = settings.in_flight
        self._connect_s = settings.llm_connect_timeout_s
        self._tls = httpx.create_ssl_context()  # the same trust store as httpx's (certifi)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}  # parsed once per path
        self._proxy = env_proxy(self._base)

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str], read_timeout_s: float) -> Answer:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._tls), headers=self._headers)
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self._base + path)
        # as httpx's Timeout(read, connect=...): connecting, each read and the wait for a free connection
        timeout = aiohttp.ClientTimeout(sock_connect=self._connect_s, sock_read=read_timeout_s, connect=read_timeout_s)
        async with self._session.post(url, data=json_bytes(body), headers=headers, timeout=timeout,
                                      allow_redirects=False, proxy=self._proxy) as response:
            return Answer(response.status, response.headers, await response.read())

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpxPools:
    """httpx clients of at most ``POOL_SHARD_SIZE`` connections each, the least busy one per call (a given
    transport, in tests, is one shared object: one client then, so it is closed once)."""

    def __init__(self, settings: Settings, headers: dict[str, str],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        shards = 1 if transport is not None else math.ceil(settings.in_flight / POOL_SHARD_SIZE)
        per_shard = math.ceil(settings.in_flight / shards)
        tls = httpx.create_ssl_context()
        self._clients = [
            httpx.AsyncClient(
                base_url=(settings.llm_base_url or "").rstrip("/"),
                headers=headers,
                timeout=httpx.Timeout(settings.llm_timeout_s, connect=settings.llm_connect_timeout_s),
                limits=httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard),
                verify=tls,
                transport=transport,
            )
            for _ in range(shards)
        ]
        self._busy = [0] * shards  # calls running per client: with at most in_flight calls, the least busy
        # client always has a free connection (shards * per_shard >= in_flight), so no call waits for one
        self._connect_s = settings.llm_connect_timeout_s

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str], read_timeout_s: float) -> Answer:
        shard = min(range(len(self._busy)), key=self._busy.__getitem__)
        self._busy[shard] += 1
        try:
            response = await self._clients[shard].post(
                path, content=json_bytes(body), headers={"content-type": "application/json", **headers},
                timeout=httpx.Timeout(read_timeout_s, connect=self._connect_s))
        finally:
            self._busy[shard] -= 1
        return Answer(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
