"""Random hostile records written straight onto the request topic while an ordinary batch runs.

The request topic is an interface: whoever can write it is untrusted (docs/security.md). Whatever such a
producer writes (urls, headers, model names, bodies, sizes, encodings, keys), a real worker on a real broker
never crashes or stalls, the provider sees only the supported endpoint path, a trap server on another port
sees nothing, every record ends in exactly one place (a result, a terminal failure or a dead letter), and the
ordinary batch beside them converges.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.json_request import BATCH_HEADER
from streamproc.core import headers
from streamproc.core.events import InferenceRequest
from streamproc.core.request_line import LineLimits
from streamproc.core.tenancy import PRIORITY_HEADER, TENANT_HEADER
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, Outcomes, WorkerProcess, chat_request, worker_env

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
TRAP = "{trap}"  # stands for the trap server's port until a record is produced
MAX_RESPONSE_BYTES = 65_536  # the worker's cap, so an echoed long prompt is an answer too large


class RecordingServer(ThreadingHTTPServer):
    """A real HTTP server on 127.0.0.1 that answers every call with a completion and records what it saw.

    The answer echoes the last message's content, so a hostile body also shapes the answer the worker reads.
    """

    daemon_threads = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []  # method, raw path, whether an Authorization header came
        super().__init__(("127.0.0.1", 0), _Recorder)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingServer

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.calls.append((self.command, self.path, "authorization" in self.headers))
        payload = json.dumps(_completion(body)).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads ``calls``."""


def _completion(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except ValueError:
        request = {}
    messages = request.get("messages") if isinstance(request, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    model = request.get("model") if isinstance(request, dict) else None
    return {"id": "chatcmpl-hostile", "object": "chat.completion", "model": model if isinstance(model, str) else "x",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": content if isinstance(content, str) else "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


@pytest.fixture
def servers() -> Iterator[tuple[RecordingServer, RecordingServer]]:
    provider, trap = RecordingServer(), RecordingServer()
    threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in (provider, trap)]
    for thread in threads:
        thread.start()
    yield provider, trap
    for server in (provider, trap):
        server.shutdown()
        server.server_close()


# -- what a hostile producer may write -------------------------------------------------------------------------

def _repeated(unit: st.SearchStrategy[Any], least: int, most: int) -> st.SearchStrategy[Any]:
    """Long values cheaply: a short drawn unit repeated (drawing each character would overrun hypothesis's
    buffer long before the sizes a hostile producer can send)."""
    return st.builds(lambda part, times: part * times, unit, st.integers(min_value=least, max_value=most))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_URLS = st.one_of(
    st.just(CHAT),
    st.sampled_from([
        f"http://127.0.0.1:{TRAP}{CHAT}", f"//127.0.0.1:{TRAP}{CHAT}", f"http://127.0.0.1:{TRAP}/",
        "/../../admin/keys", f"{CHAT}/../files", "/v1/files", "/v1/%2e%2e/files", "/v1/chat%2Fcompletions",
        "\\v1\\chat\\completions", f"{CHAT}?x=1", "#frag", f"{CHAT}\x00", f"{CHAT}\r\nHost: 127.0.0.1:{TRAP}",
        "/v1\u2215chat\u2215completions", "", "v1/chat/completions", "/V1/CHAT/COMPLETIONS", f"{CHAT}/",
        "/v1/embeddings", f"{CHAT};x", f"@127.0.0.1:{TRAP}{CHAT}",
    ]),
    st.text(max_size=60),
)
_MODELS = st.one_of(
    st.just("mock-small"), st.text(max_size=40), _repeated(st.text(min_size=1, max_size=5), 300, 2_000),
    st.sampled_from(["", "gpt-4o\x00", "../../etc/passwd", "m" * 50_000, "mock-small\r\nx-evil: 1", "模型"]),
    st.integers(), st.none(), st.lists(st.text(max_size=4), max_size=3),
)
_LONG_CONTENT = _repeated(st.sampled_from(["a", "\x00", "é", "\U0001f600", "{"]), 1_000, 60_000)
_CONTENT = st.one_of(st.text(max_size=200), _LONG_CONTENT, _JSON)
_CATASTROPHIC = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
                                                                                "pattern": "^(a+)+$"}}}
_EXTRAS = st.dictionaries(
    st.sampled_from(["max_tokens", "response_format", "temperature", "n", "stream", "tools", "user", "seed"]),
    st.one_of(_JSON, st.just(_CATASTROPHIC), st.just({"type": "json_object"}), st.integers(-2**70, 2**70)),
    max_size=3,
)


@st.composite
def _bodies(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["chat", "chat", "chat", "catastrophic", "json", "deep", "text", "cut"]))
    if kind == "catastrophic":  # a backtracking pattern against an answer built to make it backtrack
        return json.dumps({"model": "mock-small", "response_format": _CATASTROPHIC,
                           "messages": [{"role": "user", "content": json.dumps("a" * 40 + "!")}]})
    if kind == "json":
        return json.dumps(draw(_JSON))
    if kind == "deep":
        depth = draw(st.integers(min_value=1_000, max_value=100_000))
        return "[" * depth + "]" * depth
    if kind == "text":
        return draw(st.text(max_size=200))
    body = {"model": draw(_MODELS), "messages": [{"role": draw(st.sampled_from(["user", "system", "tool", "x"])),
                                                  "content": draw(_CONTENT)}], **draw(_EXTRAS)}
    text = json.dumps(body)
    return text[: draw(st.integers(min_value=0, max_value=len(text)))] if kind == "cut" else text


_HEADER_NAMES = st.one_of(
    st.sampled_from([headers.ATTEMPT, headers.DUE_TS, headers.FIRST_FAILURE_TS, headers.REPLAY, headers.DEFERRED,
                     headers.MAX_TOKENS, headers.RUN, headers.REDRIVEN, headers.ORIG_TOPIC, headers.ORIG_PARTITION,
                     headers.ORIG_OFFSET, headers.FAILURE_LAYER, headers.ERROR_CODE, headers.REQUEST_ID,
                     BATCH_HEADER, TENANT_HEADER, PRIORITY_HEADER, "authorization", "content-type"]),
    st.text(max_size=20),
)
_HEADER_VALUES = st.one_of(
    st.binary(max_size=30), st.integers(-2**70, 2**70).map(lambda n: str(n).encode()), st.just(b"1"),
    st.just(str(int(time.time() * 1000) + 365 * 86_400_000).encode()),  # a due time a year ahead
    _repeated(st.binary(min_size=1, max_size=4), 2_000, 10_000),
)


@dataclass(frozen=True)
class Hostile:
    """One record as a hostile producer writes it; the request id is given when it is produced."""

    key: str  # id | mismatch | none | empty | non-utf8
    encoding: str  # avro | truncated | flipped | bad-utf8 | json | json-line | random | empty | tombstone
    url: str
    body_json: str
    batch_id: str | None
    metadata: dict[str, str]
    headers: tuple[tuple[str, bytes], ...]
    cut: float
    noise: bytes

    def materialise(self, request_id: str, trap_port: int) -> tuple[bytes | None, bytes | None]:
        inner_id = f"{request_id}-inner" if self.key == "mismatch" else request_id
        request = InferenceRequest(request_id=inner_id, body_json=self.body_json,
                                   url=self.url.replace(TRAP, str(trap_port)), batch_id=self.batch_id,
                                   submitted_ms=int(time.time() * 1000), metadata=self.metadata)
        encoded = codec.encode(request)
        at = int(len(encoded) * self.cut)
        value = {
            "avro": encoded,
            "truncated": encoded[:at],
            "flipped": encoded[:at] + bytes([encoded[at] ^ 0x01]) + encoded[at + 1:] if at < len(encoded) else encoded,
            "bad-utf8": encoded.replace(inner_id.encode(), b"\xff" + inner_id.encode()[1:], 1),
            "json": json.dumps(asdict(request)).encode(),
            "json-line": _json_line(request),
            "random": self.noise,
            "empty": b"",
            "tombstone": None,
        }[self.encoding]
        key = {"id": request_id.encode(), "mismatch": request_id.encode(), "none": None, "empty": b"",
               "non-utf8": b"\xff\xfe" + request_id.encode()}[self.key]
        return key, b"" if key is None and value is None else value  # the producer refuses a record with neither


def _json_line(request: InferenceRequest) -> bytes:
    """The request as a producer of its own writes it as JSON: an OpenAI Batch line around the hostile body (which
    may be no JSON at all), under its batch, and as a stream request (keyed by its custom_id) without one."""
    fields = {"custom_id": request.request_id, "method": "POST", "url": request.url}
    if request.batch_id is not None:
        fields["batch_id"] = request.batch_id
    return (json.dumps(fields)[:-1] + f', "body": {request.body_json}}}').encode("utf-8", "surrogatepass")


_HOSTILE = st.builds(
    Hostile,
    key=st.sampled_from(["id", "id", "id", "mismatch", "none", "empty", "non-utf8"]),
    encoding=st.sampled_from(["avro"] * 6 + ["json-line"] * 3 + ["truncated", "flipped", "bad-utf8", "json",
                                                                 "random", "empty", "tombstone"]),
    url=_URLS,
    body_json=_bodies(),
    batch_id=st.one_of(st.none(), st.text(max_size=30), st.just("normal")),
    metadata=st.dictionaries(st.text(max_size=10), st.text(max_size=50), max_size=3),
    headers=st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=5).map(tuple),
    cut=st.floats(min_value=0, max_value=1, exclude_max=True),
    noise=st.binary(max_size=200),
)


# -- what happened to each record --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Written:
    """A record on the request topic: where it is and the request id its end is filed under, when it has one."""

    partition: int
    offset: int
    end_id: str | None


def _end_id(key: bytes | None, value: bytes | None, record_headers: list[tuple[str, bytes]]) -> str | None:
    """The id the worker files this record's end under: its key when that is text, else the id it decodes to or,
    for JSON, names (None when neither: its end is found by its position)."""
    if key:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if codec.is_json(value):
        assert value is not None
        read = codec.read_json_request(value, headers.as_mapping(record_headers), LineLimits(), 0)
        return read.request_id
    try:
        return codec.decode(value, InferenceRequest).request_id
    except codec.CodecError:
        return None


def _ends(record: Written, topic: str, outcomes: Outcomes) -> list[str]:
    """Every outcome that ended this record, described."""
    found: list[str] = []
    if record.end_id is not None:
        found += [f"result {record.end_id}"] * len(outcomes.results.get(record.end_id, []))
        found += [f"failure {e.error_code} {record.end_id}" for e in outcomes.terminal(record.end_id)]
    position = f"{topic}[{record.partition}]@{record.offset}"
    found += [f"failure {e.error_code} at {position}" for events in outcomes.failures.values() for e in events
              if e.terminal and position in e.message and e.request.request_id != record.end_id]
    found += [f"dead letter at {position}" for h in outcomes.dead_letter_headers
              if (h.get(headers.ORIG_TOPIC), h.get(headers.ORIG_PARTITION), h.get(headers.ORIG_OFFSET))
              == (topic.encode(), str(record.partition).encode(), str(record.offset).encode())]
    return found


async def _produce(settings: Settings, batch: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]
                   ) -> list[tuple[int, int]]:
    assert settings.kafka_bootstrap is not None
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5,
                                max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        sent = [await producer.send(settings.topology().requests, key=key, value=value, headers=record_headers)
                for key, value, record_headers in batch]
        return [((meta := await future).partition, meta.offset) for future in sent]
    finally:
        await producer.stop()


# -- the test -----------------------------------------------------------------------------------------------------

@hypothesis_settings(max_examples=8, deadline=None, phases=[Phase.generate], database=None,
                     suppress_health_check=list(HealthCheck))
@given(hostile=st.lists(_HOSTILE, min_size=40, max_size=80), normal_count=st.integers(min_value=10, max_value=20),
       order=st.randoms(use_true_random=False), stack=st.sampled_from(["aiohttp", "httpcore"]))
def test_a_worker_ends_every_hostile_record_once_and_calls_only_the_provider(
        hostile: list[Hostile], normal_count: int, order: Any, stack: str, settings: Settings, tmp_path: Path,
        servers: tuple[RecordingServer, RecordingServer]) -> None:
    provider, trap = servers
    assert settings.kafka_bootstrap is not None
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=settings.kafka_bootstrap), settings.topology()))
    normal = [chat_request(f"n-{uuid.uuid4().hex}", i, batch_id="normal") for i in range(normal_count)]
    batch: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (r.request_id.encode(), codec.encode(r), []) for r in normal]
    for record in hostile:
        key, value = record.materialise(f"h-{uuid.uuid4().hex}", trap.port)
        batch.append((key, value, list(record.headers)))
    order.shuffle(batch)
    positions = asyncio.run(_produce(settings, batch))
    written = [Written(partition, offset, _end_id(key, value, record_headers))
               for (key, value, record_headers), (partition, offset) in zip(batch, positions, strict=True)]

    worker = WorkerProcess(worker_env(settings, f"http://127.0.0.1:{provider.port}/v1", tmp_path / "worker",
                                      llm_http=stack, llm_api_key="sk-hostile-test",
                                      llm_max_response_bytes=str(MAX_RESPONSE_BYTES)),
                           tmp_path / "worker.log")
    worker.start()
    try:
        outcomes = asyncio.run(_outcomes(settings, written, worker))
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()

    topic = settings.topology().requests
    unended = {f"{topic}[{w.partition}]@{w.offset} ({w.end_id})": _ends(w, topic, outcomes)
               for w in written if len(_ends(w, topic, outcomes)) != 1}
    assert not unended, (unended, worker.log_tail())
    for request in normal:
        assert len(outcomes.results[request.request_id]) == 1, (request.request_id, worker.log_tail())
    internal = [e.message for events in outcomes.failures.values() for e in events if e.error_code == "internal_error"]
    assert not internal, internal
    assert trap.calls == []
    assert {(method, path) for method, path, _ in provider.calls} == {("POST", CHAT)}
    assert all(authorized for *_, authorized in provider.calls)


async def _outcomes(settings: Settings, written: list[Written], worker: WorkerProcess) -> Outcomes:
    """Outcomes once every record has ended (or 180 s have passed, or the worker has died)."""
    assert settings.kafka_bootstrap is not None
    topic = settings.topology().requests
    async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and worker.alive():
            await reader.poll()
            if all(_ends(w, topic, reader.outcomes) for w in written):
                break
        await reader.read_to_end()  # late duplicates
        return reader.outcomes
