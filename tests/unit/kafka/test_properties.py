"""A platform team's Java client properties file reads into the connection it describes; anything streamproc
cannot honour is refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.properties import ClientPropertiesError, connection_fields, read_client_properties

SCRAM = """# handed out for kafka-console-consumer --consumer.config
bootstrap.servers=b1.example:9093,b2.example:9093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="worker" password="p\\\\"w=rd";
ssl.truststore.type=PEM
ssl.truststore.location=/etc/kafka/ca.pem
ssl.endpoint.identification.algorithm=https
client.dns.lookup=use_all_dns_ips
acks=all
"""


def test_a_scram_file_gives_the_whole_connection(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(SCRAM)
    connection = KafkaConnection(**read_client_properties(path))
    assert connection.bootstrap == "b1.example:9093,b2.example:9093"
    assert connection.security_protocol == "SASL_SSL"
    assert connection.sasl_mechanism == "SCRAM-SHA-512"
    assert connection.sasl_username == "worker"
    assert connection.sasl_password is not None and connection.sasl_password.get_secret_value() == 'p"w=rd'
    assert connection.ssl_cafile == Path("/etc/kafka/ca.pem")
    assert connection.ssl_check_hostname is True
    assert "w=rd" not in connection.describe() and "worker" in connection.describe()


def test_a_pem_keystore_is_the_client_certificate_for_mtls() -> None:
    fields = connection_fields({"bootstrap.servers": "h:1", "security.protocol": "SSL", "ssl.keystore.type": "PEM",
                                "ssl.keystore.location": "/k/worker.pem", "ssl.key.password": "s3",
                                "ssl.truststore.location": "/k/ca.pem", "ssl.endpoint.identification.algorithm": ""})
    connection = KafkaConnection(**fields)
    assert connection.ssl_certfile == Path("/k/worker.pem") and connection.ssl_keyfile is None
    assert connection.ssl_key_password is not None and connection.ssl_key_password.get_secret_value() == "s3"
    assert connection.ssl_check_hostname is False


def test_oidc_client_credentials() -> None:
    fields = connection_fields({
        "bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'clientId="worker" clientSecret="s" scope="kafka";'})
    connection = KafkaConnection(**fields)
    assert connection.oauth is not None
    assert (connection.oauth.token_endpoint_url, connection.oauth.client_id, connection.oauth.scope) == \
        ("https://idp.example/token", "worker", "kafka")


def test_a_file_url_token_endpoint_is_a_token_file() -> None:
    fields = connection_fields({"sasl.oauthbearer.token.endpoint.url": "file:///var/run/token"})
    assert fields["oauth"] == {"token_file": Path("/var/run/token")}


@pytest.mark.parametrize(("key", "value", "named"), [
    ("session.timeout.ms", "45000", "session.timeout.ms"),
    ("ssl.truststore.type", "JKS", "ssl.truststore.type=JKS"),
    ("acks", "1", "acks=1"),
    ("client.dns.lookup", "resolve_canonical_bootstrap_servers_only", "client.dns.lookup"),
    ("sasl.jaas.config", "software.amazon.msk.auth.iam.IAMLoginModule required;", "IAMLoginModule"),
    ("sasl.jaas.config", 'org.apache.kafka.common.security.plain.PlainLoginModule optional username="u";',
     "'required'"),
    ("sasl.jaas.config", 'org.apache.kafka.common.security.plain.PlainLoginModule required user="u";', "user"),
    ("sasl.login.callback.handler.class", "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
     "IAMClientCallbackHandler"),
    ("ssl.endpoint.identification.algorithm", "http", "ssl.endpoint.identification.algorithm=http"),
])
def test_what_cannot_be_honoured_is_refused_by_name(key: str, value: str, named: str) -> None:
    with pytest.raises(ClientPropertiesError, match=re.escape(named)):
        connection_fields({key: value})


def test_an_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ClientPropertiesError, match=r"missing\.properties"):
        read_client_properties(tmp_path / "missing.properties")


def test_the_refusal_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.properties"
    path.write_text("linger.ms=5\n")
    with pytest.raises(ClientPropertiesError, match=r"x\.properties: unsupported client property 'linger\.ms'"):
        read_client_properties(path)
