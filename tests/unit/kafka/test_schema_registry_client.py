"""The registry client's HTTP side that a registry without authentication cannot show: basic auth is sent, and a
refusal of the credentials is one line that names the settings and not the password (the registry itself is
tested for real in tests/integration/test_schema_registry.py)."""

from __future__ import annotations

import base64

import httpx
import pytest
from pydantic import SecretStr

from streamproc.kafka.schema_registry import SchemaRegistry, SchemaRegistryRefused
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
