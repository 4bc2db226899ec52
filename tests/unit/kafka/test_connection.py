"""The connection value refuses settings that cannot work together, before any client tries them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from streamproc.app.bootstrap import ConnectionSettingsError, resolve_connection
from streamproc.kafka.clients import auth_options
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings


@pytest.mark.parametrize(("fields", "reason"), [
    ({"security_protocol": "SASL_SSL"}, "needs a SASL mechanism"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u"},
     "needs a username and a password"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER"}, "needs a token source"),
    ({"sasl_mechanism": "PLAIN"}, "needs security protocol SASL_SSL"),
    ({"ssl_cafile": "/ca.pem"}, "does not use TLS"),
    ({"security_protocol": "SSL", "ssl_keyfile": "/k.pem"}, "needs its certificate"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
      "oauth": {"token_file": "/t", "provider": "m:f"}}, "exactly one token source"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
      "oauth": {"token_endpoint_url": "https://idp/token"}}, "client id and a client secret"),
])
def test_contradictions_are_refused(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        KafkaConnection(bootstrap="h:1", **fields)


def test_the_environment_overrides_the_properties_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMPROC_KAFKA_BOOTSTRAP", raising=False)  # scripts/test sets it for the suite
    properties = tmp_path / "c.properties"
    properties.write_text("bootstrap.servers=file:9093\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                          'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required '
                          'username="from-file" password="x";\n')
    password_file = tmp_path / "password"
    password_file.write_text("from-secret-file\n")
    connection = resolve_connection(Settings(kafka_client_properties=properties, kafka_sasl_username="from-env",
                                             kafka_sasl_password_file=password_file))
    assert connection.bootstrap == "file:9093"
    assert connection.sasl_username == "from-env"
    assert connection.sasl_password is not None and connection.sasl_password.get_secret_value() == "from-secret-file"
    # -b wins over bootstrap.servers
    assert resolve_connection(Settings(kafka_client_properties=properties, kafka_bootstrap="cli:1")).bootstrap == \
        "cli:1"


def test_a_refused_combination_is_one_line_without_secrets() -> None:
    with pytest.raises(ConnectionSettingsError) as refused:
        resolve_connection(Settings(kafka_bootstrap="h:1", kafka_security_protocol="SASL_SSL",
                                    kafka_sasl_mechanism="PLAIN", kafka_sasl_password="hunter2"))
    assert "\n" not in str(refused.value) and "hunter2" not in str(refused.value)
    assert "needs a username and a password" in str(refused.value)


def test_plaintext_clients_get_no_security_options() -> None:
    assert auth_options(KafkaConnection(bootstrap="h:1")) == {"security_protocol": "PLAINTEXT"}


def test_scram_options_carry_the_mechanism_and_credentials() -> None:
    options = auth_options(KafkaConnection(bootstrap="h:1", security_protocol="SASL_PLAINTEXT",
                                           sasl_mechanism="SCRAM-SHA-256", sasl_username="u", sasl_password="p"))
    assert options == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                       "sasl_plain_username": "u", "sasl_plain_password": "p"}
