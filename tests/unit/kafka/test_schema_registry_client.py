"""The registry client's HTTP side: basic auth is sent, a refusal of the credentials is one line that names the
settings and not the password, and an unknown id is fetched off the event loop (the registry itself is tested for
real in tests/integration/test_schema_registry.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import pytest
from pydantic import SecretStr

from streamproc import codec
from streamproc.codec import avro_schema
from streamproc.core.events import InferenceRequest
from streamproc.kafka.schema_registry import SchemaNotFetched, SchemaRegistry, SchemaRegistryRefused
from streamproc.settings import RegistryAccess, Settings

ACCESS = RegistryAccess(url="http://registry.test/apis/ccompat/v7", username="svc", password=SecretStr("s3cret-pw"))


def test_basic_auth_is_sent_and_a_refusal_names_the_settings_not_the_password() -> None:
    seen: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return httpx.Response(401, json={"error_code": 401, "message": "Unauthorized"})

    registry = SchemaRegistry(ACCESS, transport=httpx.MockTransport(refuse))
    with pytest.raises(SchemaRegistryRefused) as refused:
        registry.schema(7)
    assert seen == ["Basic " + base64.b64encode(b"svc:s3cret-pw").decode()]
    message = str(refused.value)
    assert "STREAMPROC_SCHEMA_REGISTRY_USERNAME" in message and "s3cret-pw" not in message and "\n" not in message


def test_settings_give_the_registry_only_when_its_url_is_set() -> None:
    assert Settings(schema_registry_url=None).schema_registry is None
    access = Settings(schema_registry_url="https://sr.test:8081", schema_registry_username="svc",
                      schema_registry_password=SecretStr("pw")).schema_registry
    assert access is not None and access.url == "https://sr.test:8081" and access.username == "svc"
    assert "pw" not in repr(access)
    with pytest.raises(ValueError, match="https"):
        Settings(schema_registry_url="sr.test:8081")


SCHEMA_TEXT = json.dumps(avro_schema(InferenceRequest))


def _frame(schema_id: int) -> bytes:
    return codec.encode_confluent(InferenceRequest(request_id="r-1", body_json="{}"), schema_id)


def test_an_unknown_id_is_fetched_in_a_thread_while_the_event_loop_keeps_running() -> None:
    """A lookup blocks for up to its timeout; on the worker's loop it would stop every heartbeat. The answer here
    takes 0.5 s: the loop must tick all along, and records naming the same id share one request."""
    requests: list[str] = []

    def slow(request: httpx.Request) -> httpx.Response:
        requests.append(request.url.path)
        time.sleep(0.5)
        return httpx.Response(200, json={"schema": SCHEMA_TEXT})

    registry = SchemaRegistry(ACCESS, transport=httpx.MockTransport(slow))
    with pytest.raises(SchemaNotFetched, match="not fetched"):
        registry.known_schema(7)  # the loop's lookup never asks the registry itself

    async def scenario() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        await asyncio.gather(*(registry.fetch_ahead(_frame(7)) for _ in range(3)))
        ticker.cancel()
        return ticks

    assert asyncio.run(scenario()) >= 20  # ~50 ticks of 10 ms in 0.5 s; a blocked loop gives 0 or 1
    assert requests == ["/apis/ccompat/v7/schemas/ids/7"]
    assert codec.decode(_frame(7), InferenceRequest, schema_lookup=registry.known_schema).request_id == "r-1"


def test_a_failed_fetch_is_reported_by_the_lookup_and_tried_again_by_the_next_record() -> None:
    answers = [httpx.Response(404, json={"error_code": 40403, "message": "Schema 9 not found"}),
               httpx.Response(200, json={"schema": SCHEMA_TEXT})]
    registry = SchemaRegistry(ACCESS, transport=httpx.MockTransport(lambda request: answers.pop(0)))
    asyncio.run(registry.fetch_ahead(_frame(9)))
    with pytest.raises(codec.CodecError, match="answered 404 on schema id 9"):
        codec.decode(_frame(9), InferenceRequest, schema_lookup=registry.known_schema)
    asyncio.run(registry.fetch_ahead(_frame(9)))
    assert registry.known_schema(9) == SCHEMA_TEXT
    asyncio.run(registry.fetch_ahead(b"{}"))  # no Confluent frame: nothing to fetch, no request
    assert answers == []
