"""The providers' batch APIs over async httpx (issue 31): OpenAI's Files and Batches (upload a JSONL file with
purpose ``batch``, create a batch with the 24 h window, retrieve, list, cancel, read the output and error files)
and Anthropic's Message Batches (create, retrieve, list, cancel, read the results stream).

The same conventions as the synchronous client (:mod:`streamproc.llm.client`): the calls go to paths joined under
``STREAMPROC_LLM_BASE_URL`` and checked to stay under it (:func:`streamproc.llm.endpoint_url.joined_url`), a
provider's id is joined only when it is a plain token, the key is sent only where
:func:`streamproc.llm.api_key.check_llm_key` allows, redirects are not followed (the key stays with the host it
was meant for; so is Anthropic's ``results_url``: the results are read from the path under the base URL), the
trust store is httpx's, and every failure is the synchronous call's classification with the key redacted
(:class:`BatchCallFailed`). Answers are parsed into values by :mod:`streamproc.core.provider_batch_objects`;
result files are read line by line, never whole (an output file may be 200 MB).

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, Final

import httpx

from streamproc.core.endpoints import CHAT_COMPLETIONS
from streamproc.core.outcome import ConfigurationProblem, Failure, truncate
from streamproc.core.provider_batch_gatherer import ANTHROPIC_LIMITS, OPENAI_LIMITS
from streamproc.core.provider_batch_objects import (
    BatchPage,
    MalformedAnswer,
    ProviderBatchView,
    anthropic_batch,
    batch_page,
    openai_batch,
    openai_file_id,
)
from streamproc.core.provider_batch_requests import anthropic_body, anthropic_request, openai_line
from streamproc.core.provider_batch_takeover import (
    CLOCK_SKEW_MS,
    GATHER_METADATA_KEY,
    ProviderBatchRecord,
    adoptable,
)
from streamproc.core.redact import redact
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.api_key import check_llm_key
from streamproc.llm.endpoint_url import joined_url
from streamproc.llm.transport_errors import classify_exception
from streamproc.settings import LLMEndpoint

COMPLETION_WINDOW: Final = "24h"  # the only window OpenAI offers
ANTHROPIC_VERSION: Final = "2023-06-01"
MALFORMED_ANSWER: Final = "malformed_batch_answer"
_PLAIN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")
_MAX_ERROR_BYTES: Final = 64 * 1024  # of an error answer's body, read for its classification


class BatchCallFailed(Exception):
    """A batch API call that did not give its answer; ``outcome`` is what a synchronous call failing the same
    way comes to (a 429 is service, a 401 a configuration problem, a refused connection transport)."""

    def __init__(self, what: str, outcome: Failure | ConfigurationProblem) -> None:
        super().__init__(f"{what}: {outcome.code}: {outcome.message}")
        self.outcome = outcome


class _BatchHttp:
    """One httpx client under the base URL with the provider's auth headers; errors as :class:`BatchCallFailed`."""

    def __init__(self, endpoint: LLMEndpoint, auth_headers: Callable[[str], dict[str, str]],
                 parse_batch: Callable[[Any], ProviderBatchView], transport: httpx.AsyncBaseTransport | None) -> None:
        if not endpoint.base_url:
            raise ValueError("STREAMPROC_LLM_BASE_URL is not set: there is no provider to send batches to")
        key = check_llm_key(endpoint)
        self._base_url = endpoint.base_url
        self._parse_batch = parse_batch
        self._secrets = () if key is None else (key,)
        self._max_answer_bytes = endpoint.max_response_bytes  # of a JSON answer (a batch object, a page)
        self._client = httpx.AsyncClient(
            headers={"user-agent": "streamproc", **(auth_headers(key) if key is not None else {})},
            timeout=httpx.Timeout(endpoint.read_timeout_s, connect=endpoint.connect_timeout_s),
            verify=httpx.create_ssl_context(),
            follow_redirects=False,
            transport=transport,
        )

    def url(self, *parts: str) -> httpx.URL:
        """The path of ``parts`` under the base URL; an id that is not a plain token is refused, never sent."""
        for part in parts[1:]:
            if not _PLAIN_ID.fullmatch(part):
                raise ValueError(f"{part!r} is not a provider id (letters, digits, '_' and '-')")
        relative = "/".join(parts)
        return joined_url(self._base_url, relative, f"batch API path {relative}")

    async def json(self, method: str, url: httpx.URL, what: str, **kwargs: Any) -> Any:
        """The decoded JSON answer of a 2xx; :class:`BatchCallFailed` otherwise."""
        async with self.stream(method, url, what, **kwargs) as response:
            body = await _first_bytes(response, self._max_answer_bytes + 1)
        if len(body) > self._max_answer_bytes:
            raise self._malformed(what, f"the answer passes STREAMPROC_LLM_MAX_RESPONSE_BYTES "
                                        f"({self._max_answer_bytes:,} bytes); not read further")
        try:
            return json.loads(body)
        except ValueError:
            raise self._malformed(what, f"the answer is not JSON: {body[:200]!r}") from None

    @asynccontextmanager
    async def stream(self, method: str, url: httpx.URL, what: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """The response of a 2xx, its body unread; :class:`BatchCallFailed` for an error answer or an exception."""
        try:
            async with self._client.stream(method, url, **kwargs) as response:
                if not 200 <= response.status_code < 300:
                    body = await _first_bytes(response, _MAX_ERROR_BYTES)
                    outcome = classify_http_error(response.status_code, response.headers, body)
                    raise BatchCallFailed(what, _redacted(outcome, self._secrets))
                yield response
        except (httpx.HTTPError, OSError) as exc:
            raise BatchCallFailed(what, classify_exception(exc, self._secrets)) from None

    def _malformed(self, what: str, message: str) -> BatchCallFailed:
        """An answer not of the provider's shape: a service failure (a broken gateway answers so), retried."""
        return BatchCallFailed(what, Failure(FailureLayer.SERVICE, MALFORMED_ANSWER,
                                             truncate(redact(message, self._secrets))))

    def parsed(self, what: str, parse: Callable[[Any], Any], doc: Any) -> Any:
        """``parse(doc)``; a shape it refuses is :class:`BatchCallFailed` (``malformed_batch_answer``)."""
        try:
            return parse(doc)
        except MalformedAnswer as exc:
            raise self._malformed(what, str(exc)) from None

    async def batch(self, method: str, parts: tuple[str, ...], what: str, **kwargs: Any) -> ProviderBatchView:
        """The batch object a call answers, parsed into a view by the provider's parser."""
        doc = await self.json(method, self.url(*parts), what, **kwargs)
        view: ProviderBatchView = self.parsed(what, self._parse_batch, doc)
        return view

    async def lines(self, url: httpx.URL, what: str) -> AsyncIterator[str]:
        """The non-empty lines of a JSONL download, as they arrive."""
        async with self.stream("GET", url, what) as response:  # a broken download fails as the call would
            async for line in response.aiter_lines():
                if line.strip():
                    yield line

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True)
class Submitted:
    """A provider batch just created, and the input file it reads (OpenAI's; Anthropic's batches have none)."""

    view: ProviderBatchView
    input_file_id: str | None


class OpenAIBatches:
    """OpenAI's Files and Batches; ``transport`` (tests) replaces the network."""

    provider: Final = "openai"
    limits: Final = OPENAI_LIMITS

    def __init__(self, endpoint: LLMEndpoint, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = _BatchHttp(endpoint, lambda key: {"authorization": f"Bearer {key}"}, openai_batch, transport)

    @staticmethod
    def line(custom_id: str, body: dict[str, Any]) -> bytes:
        """A request's line of an input file."""
        return openai_line(custom_id, body)

    async def submit(self, lines: Sequence[bytes], gather_id: str) -> Submitted:
        """Upload ``lines`` as an input file and create its batch, ``gather_id`` in its metadata (found again by
        :func:`find_created` after a crash)."""
        file_id = await self.upload(b"\n".join(lines) + b"\n", f"{gather_id}.jsonl")
        view = await self.create(file_id, CHAT_COMPLETIONS.url, {GATHER_METADATA_KEY: gather_id})
        return Submitted(view, file_id)

    async def upload(self, content: bytes, filename: str = "batch.jsonl") -> str:
        """Upload a JSONL input file (purpose ``batch``); its file id."""
        doc = await self._http.json("POST", self._http.url("files"), "upload a batch file",
                                    files={"file": (filename, content, "application/jsonl")},
                                    data={"purpose": "batch"})
        file_id: str = self._http.parsed("upload a batch file", openai_file_id, doc)
        return file_id

    async def create(self, input_file_id: str, endpoint: str, metadata: Mapping[str, str] | None = None,
                     headers: Mapping[str, str] | None = None) -> ProviderBatchView:
        """Create a batch of the uploaded file for ``endpoint`` (``/v1/chat/completions``) in the 24 h window;
        ``metadata`` carries our own ids, so that a batch created just before a crash can be found again."""
        body: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": endpoint,
                                "completion_window": COMPLETION_WINDOW}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        return await self._http.batch("POST", ("batches",), "create a batch", json=body, headers=headers)

    async def retrieve(self, batch_id: str) -> ProviderBatchView:
        return await self._http.batch("GET", ("batches", batch_id), f"retrieve batch {batch_id}")

    async def cancel(self, batch_id: str) -> ProviderBatchView:
        return await self._http.batch("POST", ("batches", batch_id, "cancel"), f"cancel batch {batch_id}")

    async def page(self, after: str | None = None, limit: int = 100) -> BatchPage:
        """One page of the account's batches, newest first."""
        params: dict[str, str | int] = {"limit": limit} | ({"after": after} if after else {})
        what = "list batches"
        doc = await self._http.json("GET", self._http.url("batches"), what, params=params)
        page: BatchPage = self._http.parsed(what, lambda d: batch_page(d, openai_batch), doc)
        return page

    def file_lines(self, file_id: str) -> AsyncIterator[str]:
        """The lines of an output or error file, as they are downloaded."""
        return self._http.lines(self._http.url("files", file_id, "content"), f"download file {file_id}")

    async def ended_lines(self, view: ProviderBatchView) -> AsyncIterator[str]:
        """Every results line of an ended batch: its output file's, then its error file's (a failed batch has
        neither)."""
        for file_id in (view.output_file_id, view.error_file_id):
            if file_id is not None:
                async for line in self.file_lines(file_id):
                    yield line

    async def aclose(self) -> None:
        await self._http.aclose()


class AnthropicBatches:
    """Anthropic's Message Batches; ``transport`` (tests) replaces the network."""

    provider: Final = "anthropic"
    limits: Final = ANTHROPIC_LIMITS

    def __init__(self, endpoint: LLMEndpoint, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = _BatchHttp(endpoint, lambda key: {"x-api-key": key}, anthropic_batch, transport)
        self._version = {"anthropic-version": ANTHROPIC_VERSION}

    @staticmethod
    def line(custom_id: str, body: dict[str, Any]) -> bytes:
        """A request of the create call's body; :class:`NotConvertible` says what the Messages API cannot carry."""
        return anthropic_request(custom_id, body)

    async def submit(self, lines: Sequence[bytes], gather_id: str) -> Submitted:
        """Create the batch of ``lines`` (its requests carry no metadata: :func:`find_created` matches it by count and
        time after a crash)."""
        return Submitted(await self.create(anthropic_body(lines)), None)

    async def create(self, requests: bytes, headers: Mapping[str, str] | None = None) -> ProviderBatchView:
        """Create a batch of ``requests``: the body ``{"requests": [{"custom_id", "params"}, ...]}`` as bytes (the
        gatherer sized it)."""
        return await self._http.batch("POST", ("messages", "batches"), "create a message batch", content=requests,
                                 headers={**self._version, "content-type": "application/json", **(headers or {})})

    async def retrieve(self, batch_id: str) -> ProviderBatchView:
        return await self._http.batch("GET", ("messages", "batches", batch_id), f"retrieve message batch {batch_id}",
                                 headers=self._version)

    async def cancel(self, batch_id: str) -> ProviderBatchView:
        return await self._http.batch("POST", ("messages", "batches", batch_id, "cancel"),
                                 f"cancel message batch {batch_id}", headers=self._version)

    async def page(self, after_id: str | None = None, limit: int = 100) -> BatchPage:
        """One page of the workspace's batches, newest first."""
        params: dict[str, str | int] = {"limit": limit} | ({"after_id": after_id} if after_id else {})
        what = "list message batches"
        doc = await self._http.json("GET", self._http.url("messages", "batches"), what, params=params,
                                    headers=self._version)
        page: BatchPage = self._http.parsed(what, lambda d: batch_page(d, anthropic_batch), doc)
        return page

    def result_lines(self, batch_id: str) -> AsyncIterator[str]:
        """The results stream of an ended batch, line by line (from the path under the base URL, not from the
        answer's ``results_url``: the key goes to no host an answer names)."""
        return self._http.lines(self._http.url("messages", "batches", batch_id, "results"),
                                f"read the results of message batch {batch_id}")

    def ended_lines(self, view: ProviderBatchView) -> AsyncIterator[str]:
        """Every results line of an ended batch."""
        return self.result_lines(view.batch_id)

    async def aclose(self) -> None:
        await self._http.aclose()


ProviderBatches = OpenAIBatches | AnthropicBatches  # the route's client, chosen by STREAMPROC_PROVIDER_BATCH_API


async def find_created(api: ProviderBatches, record: ProviderBatchRecord, taken: Collection[str],
                       max_pages: int = 10) -> ProviderBatchView | None:
    """The batch a ``creating`` record's create call made, if the provider has it
    (:func:`streamproc.core.provider_batch_takeover.adoptable`): the provider's batches, newest first, are read
    until they are older than the record by more than the clock skew (or ``max_pages`` pages)."""
    candidates: list[ProviderBatchView] = []
    after = None
    for _ in range(max_pages):
        page = await api.page(after)
        candidates += page.batches
        oldest = page.batches[-1].created_ms if page.batches else None
        if (not page.has_more or page.last_id is None
                or (oldest is not None and oldest < record.created_ms - CLOCK_SKEW_MS)):
            break
        after = page.last_id
    return adoptable(record, candidates, taken)


async def _first_bytes(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        parts.append(chunk[:limit - size])
        size += len(parts[-1])
        if size >= limit:
            break
    return b"".join(parts)


def _redacted(outcome: Failure | ConfigurationProblem, secrets: tuple[str, ...]) -> Failure | ConfigurationProblem:
    return replace(outcome, message=redact(outcome.message, secrets))
