"""What carries the LLM client's POSTs (``STREAMPROC_LLM_HTTP``): aiohttp's client, or httpx on httpcore.

Both send the same JSON bytes and give back the status, headers and body; their exceptions are classified
into the same codes (:mod:`streamproc.llm.transport_errors`). aiohttp is the default because it costs a
fraction of httpx's CPU per call (design §5.5, "The HTTP stack and the event loop"). httpx stays for tests,
whose mock transports replace the network, and as ``STREAMPROC_LLM_HTTP=httpcore``.

Each POST goes to an absolute URL the client joined from its endpoint table (:mod:`streamproc.llm.endpoint_url`),
never to a path a record wrote. Answers are read streamed, and reading stops once the *decoded* body passes
``STREAMPROC_LLM_MAX_RESPONSE_BYTES`` (:attr:`Answer.too_large`): aiohttp decompresses in bounded steps
itself; httpx's decoders expand a whole network read at once (a 64 KiB read of a gzip bomb is 64 MB), so its
stack reads the raw bytes and inflates them with zlib's ``max_length``.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import httpx
from yarl import URL

from streamproc.settings import LLMEndpoint

# httpcore 1.0's pool does work proportional to its connections each time a request starts or ends, and to
# the square of its idle connections (``_assign_requests_to_connections`` counts the idle ones once per idle
# connection), so one pool as large as the in-flight limit starves the event loop before the limit is
# reached. Pools of at most this many connections, the least busy chosen per call, bound the total the same
# way at a small fraction of that cost. They share one TLS context (each would otherwise load and hold the CA
# bundle). aiohttp's connector has no such cost: one pool of them all.
POOL_SHARD_SIZE = 8


@dataclass(frozen=True)
class Answer:
    """What came back: any status, the headers (case-insensitive), the decoded body; ``too_large``: the body
    went on past the cap, and ``content`` is its first ``cap`` bytes (the rest was never read)."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    too_large: bool = False


class HttpStack(Protocol):
    """POSTs JSON to an absolute URL under the base URL; raises what its library raises (classified by the
    caller)."""

    async def post(self, url: httpx.URL, body: dict[str, Any], headers: dict[str, str],
                   read_timeout_s: float) -> Answer: ...

    async def aclose(self) -> None: ...


def http_stack(endpoint: LLMEndpoint, connections: int, headers: dict[str, str],
               transport: httpx.AsyncBaseTransport | None = None) -> HttpStack:
    """The endpoint's stack with ``connections`` connections in all; a given httpx transport (tests) means
    httpx."""
    if transport is None and endpoint.http == "aiohttp":
        return AiohttpStack(endpoint, connections, headers)
    return HttpxPools(endpoint, connections, headers, transport)


_WIRE_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)  # one, not one per call


def json_bytes(body: dict[str, Any]) -> bytes:
    """The body as httpx's ``json=`` writes it (compact, UTF-8; NaN refused), for either stack."""
    return _WIRE_JSON.encode(body).encode()


def env_proxy(url: str) -> str | None:
    """The proxy ``HTTP(S)_PROXY`` names for the URL's scheme unless ``NO_PROXY`` exempts its host, as httpx
    honours them. Read once: aiohttp's ``trust_env`` reads them, and ``~/.netrc``, in a thread on every
    request."""
    parts = urlsplit(url)
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


class AiohttpStack:
    """One aiohttp session (made at the first call: it needs the running loop), ``connections`` connections."""

    def __init__(self, endpoint: LLMEndpoint, connections: int, headers: dict[str, str]) -> None:
        self._headers = {**headers, "content-type": "application/json"}
        self._limit = connections
        self._connect_s = endpoint.connect_timeout_s
        self._cap = endpoint.max_response_bytes
        self._tls = httpx.create_ssl_context()  # the same trust store as httpx's (certifi)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[httpx.URL, URL] = {}  # converted once per endpoint
        self._proxy = env_proxy(endpoint.base_url or "")

    async def post(self, url: httpx.URL, body: dict[str, Any], headers: dict[str, str],
                   read_timeout_s: float) -> Answer:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._tls), headers=self._headers)
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = URL(str(url), encoded=True)  # already joined and checked: sent as it is
        # as httpx's Timeout(read, connect=...): connecting, each read and the wait for a free connection
        timeout = aiohttp.ClientTimeout(sock_connect=self._connect_s, sock_read=read_timeout_s, connect=read_timeout_s)
        async with self._session.post(target, data=json_bytes(body), headers=headers, timeout=timeout,
                                      allow_redirects=False, proxy=self._proxy) as response:
            content, too_large = await _capped(response.content.iter_chunked(_CHUNK), self._cap)
            if too_large:
                response.close()  # the connection goes, with the unread rest
            return Answer(response.status, response.headers, content, too_large)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpxPools:
    """httpx clients of at most ``POOL_SHARD_SIZE`` connections each, the least busy one per call (a given
    transport, in tests, is one shared object: one client then, so it is closed once)."""

    def __init__(self, endpoint: LLMEndpoint, connections: int, headers: dict[str, str],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        shards = 1 if transport is not None else math.ceil(connections / POOL_SHARD_SIZE)
        per_shard = math.ceil(connections / shards)
        tls = httpx.create_ssl_context()
        self._clients = [
            httpx.AsyncClient(
                headers={**headers, "accept-encoding": _HTTPX_ENCODINGS},
                timeout=httpx.Timeout(endpoint.read_timeout_s, connect=endpoint.connect_timeout_s),
                limits=httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard),
                verify=tls,
                transport=transport,
            )
            for _ in range(shards)
        ]
        self._busy = [0] * shards  # calls running per client: with at most `connections` calls, the least busy
        # client always has a free connection (shards * per_shard >= connections), so no call waits for one
        self._connect_s = endpoint.connect_timeout_s
        self._cap = endpoint.max_response_bytes

    async def post(self, url: httpx.URL, body: dict[str, Any], headers: dict[str, str],
                   read_timeout_s: float) -> Answer:
        shard = min(range(len(self._busy)), key=self._busy.__getitem__)
        self._busy[shard] += 1
        try:
            async with self._clients[shard].stream(
                    "POST", url, content=json_bytes(body), headers={"content-type": "application/json", **headers},
                    timeout=httpx.Timeout(read_timeout_s, connect=self._connect_s)) as response:
                if response.is_stream_consumed:  # a response made whole in memory (tests' mock transports)
                    decoded = _whole(response.content)
                else:
                    decoded = _inflated(response.aiter_raw(_CHUNK), response.headers.get("content-encoding", ""),
                                        self._cap)
                async with aclosing(decoded):  # closed before the response is, also when reading stops early
                    content, too_large = await _capped(decoded, self._cap)
        finally:
            self._busy[shard] -= 1
        return Answer(response.status_code, response.headers, content, too_large)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


_CHUNK = 64 * 1024
# what the httpx stack asks for and can inflate in bounded steps (httpx would add br and zstd when installed)
_HTTPX_ENCODINGS = "gzip, deflate"


async def _capped(chunks: AsyncIterator[bytes], cap: int) -> tuple[bytes, bool]:
    """The decoded body up to ``cap`` bytes, and whether more came: reading stops at the first byte past it."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        if size + len(chunk) > cap:
            parts.append(chunk[:cap - size])
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def _whole(content: bytes) -> AsyncGenerator[bytes, None]:
    yield content


async def _inflated(raw: AsyncIterator[bytes], encoding: str, cap: int) -> AsyncGenerator[bytes, None]:
    """The body decoded as ``content-encoding`` says, never more than ``cap + 1`` bytes out of one step (so a
    bomb stops at the cap); httpx's DecodingError for a body that is not what it claims, as httpx raises."""
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip() and c.strip().lower() != "identity"]
    if not codings:
        async for chunk in raw:
            yield chunk
        return
    if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
        raise httpx.DecodingError(f"content-encoding {encoding!r} was not asked for (accept-encoding: "
                                  f"{_HTTPX_ENCODINGS})")
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if codings[0] != "deflate" else zlib.MAX_WBITS)
    first = True
    out = 0
    async for chunk in raw:
        if first and codings[0] == "deflate" and chunk and chunk[0] & 0x0F != 8:  # raw deflate, as servers send it
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        first = first and not chunk
        pending = chunk
        while pending and not inflater.eof:
            try:
                data = inflater.decompress(pending, cap + 1 - out)
            except zlib.error as exc:
                raise httpx.DecodingError(f"the body is not {codings[0]} as its content-encoding says: {exc}") from exc
            out += len(data)
            if data:
                yield data
            if out > cap:
                return
            pending = inflater.unconsumed_tail
    if not inflater.eof and not first:
        raise httpx.DecodingError(f"the {codings[0]} body ends before its compressed stream does")
