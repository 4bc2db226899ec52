"""The registry client's HTTP side: basic auth is sent, a refusal of the credentials is one line that names the
settings and not the password, an unknown id is fetched off the event loop, and an https registry is trusted through
a private CA file (the registry itself is tested for
real in tests/integration/test_schema_registry.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from streamproc import codec
from streamproc.codec import avro_schema
from streamproc.core.events import InferenceRequest
from streamproc.devstack.certificates import CertificateSet, ensure_certificates
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


@pytest.fixture(scope="module")
def https_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, CertificateSet]]:
    """A real HTTPS server on 127.0.0.1 with a certificate from a private CA, answering every schema id."""
    certificates = ensure_certificates(tmp_path_factory.mktemp("ca"), [])

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"schema": SCHEMA_TEXT}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates.broker)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", certificates
    server.shutdown()
    server.server_close()


def test_an_https_registry_is_trusted_through_its_private_ca_file_and_only_then(
        https_registry: tuple[str, CertificateSet]) -> None:
    url, certificates = https_registry
    trusted = SchemaRegistry(RegistryAccess(url=url, username=None, password=None, ca_file=certificates.ca))
    assert trusted.schema(1) == SCHEMA_TEXT
    for ca_file in (None, certificates.other_ca):  # the system's store, or another CA: the certificate is refused
        with pytest.raises(SchemaRegistryRefused, match="CERTIFICATE_VERIFY_FAILED"):
            SchemaRegistry(RegistryAccess(url=url, username=None, password=None, ca_file=ca_file)).schema(1)
    with pytest.raises(SchemaRegistryRefused, match="STREAMPROC_SCHEMA_REGISTRY_CA_FILE"):
        SchemaRegistry(RegistryAccess(url=url, username=None, password=None, ca_file=certificates.broker.parent / "no"))
    assert Settings(schema_registry_url=url, schema_registry_ca_file=certificates.ca).schema_registry == \
        RegistryAccess(url=url, username=None, password=None, ca_file=certificates.ca)
