"""The secure broker's files without a broker: certificates, client properties files, its server config."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streamproc.core.acls import PRINCIPALS, sink_group_prefix
from streamproc.devstack.certificates import CertificateSet, ensure_certificates
from streamproc.devstack.client_properties import (
    OIDC_LOGIN_HANDLER,
    mtls_properties,
    oauth_properties,
    parse_properties,
    render_properties,
    scram_properties,
    unsecured_oauth_properties,
    write_properties,
)
from streamproc.devstack.secure_broker import (
    SecureBrokerStatus,
    SecurePorts,
    scram_format_args,
    secure_server_properties,
)
from streamproc.settings import Settings
from streamproc.sink.follow import default_group

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return ensure_certificates(tmp_path_factory.mktemp("tls"), PRINCIPALS, now=NOW)


def chain(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def test_the_broker_certificate_names_loopback_and_serves_and_connects(certs: CertificateSet) -> None:
    leaf, issuer = chain(certs.broker)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    assert issuer == chain(certs.ca)[0]
    leaf.verify_directly_issued_by(issuer)


def test_each_principal_has_a_certificate_whose_cn_is_its_name(certs: CertificateSet) -> None:
    ca = chain(certs.ca)[0]
    for name, path in certs.keystores.items():
        text = path.read_text()
        assert text.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, what Kafka's PEM keystore reads
        leaf = chain(path)[0]
        assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        assert leaf.not_valid_before_utc <= NOW < leaf.not_valid_after_utc
        leaf.verify_directly_issued_by(ca)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((certs.directory / "ca-key.pem").stat().st_mode) == 0o600


def test_the_expired_certificate_is_expired_and_the_other_ca_is_another(certs: CertificateSet) -> None:
    expired = chain(certs.expired)[0]
    assert expired.not_valid_after_utc < NOW
    expired.verify_directly_issued_by(chain(certs.ca)[0])  # the right CA: refused only for its dates
    other_ca = chain(certs.other_ca)[0]
    assert other_ca.subject != chain(certs.ca)[0].subject
    broker_leaf = chain(certs.broker)[0]
    with pytest.raises(ValueError):  # another issuer
        broker_leaf.verify_directly_issued_by(other_ca)
    chain(certs.other_ca_client)[0].verify_directly_issued_by(other_ca)


def test_certificates_are_kept_across_calls(certs: CertificateSet) -> None:
    before = certs.ca.read_bytes()
    again = ensure_certificates(certs.directory, PRINCIPALS)
    assert again.ca.read_bytes() == before
    assert isinstance(chain(again.keystores["worker"])[0].public_key(), ec.EllipticCurvePublicKey)


def test_client_files_are_java_properties_with_absolute_paths(tmp_path: Path) -> None:
    ca, keystore = tmp_path / "ca.pem", tmp_path / "worker.pem"
    scram = scram_properties("127.0.0.1:1", ca, "worker", "p4ss")
    assert scram == {
        "bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="worker" '
                            'password="p4ss";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca)}
    mtls = mtls_properties("127.0.0.1:2", ca, keystore)
    assert mtls["security.protocol"] == "SSL" and mtls["ssl.keystore.type"] == "PEM"
    assert mtls["ssl.keystore.location"] == str(keystore)
    oauth = oauth_properties("127.0.0.1:3", ca, "worker", "s3cret", "http://127.0.0.1:9/token")
    assert oauth["sasl.mechanism"] == "OAUTHBEARER"
    assert oauth["sasl.oauthbearer.token.endpoint.url"] == "http://127.0.0.1:9/token"
    assert oauth["sasl.login.callback.handler.class"] == OIDC_LOGIN_HANDLER
    assert 'clientId="worker" clientSecret="s3cret";' in oauth["sasl.jaas.config"]
    unsecured = unsecured_oauth_properties("127.0.0.1:3", ca, "sink")
    assert unsecured["sasl.jaas.config"] == ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                                             'required unsecuredLoginStringClaim_sub="sink";')
    assert "sasl.login.callback.handler.class" not in unsecured  # the client's own unsecured token

    path = write_properties(tmp_path / "worker-scram.properties", scram)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert parse_properties(path.read_text()) == scram
    assert render_properties({"a": "C:\\x"}) == "a=C:\\\\x\n"
    with pytest.raises(ValueError, match="quote"):
        scram_properties("h:1", ca, "worker", 'pa"ss')
    with pytest.raises(ValueError, match="lines"):
        render_properties({"a": "b\nc=d"})


def test_server_config_authenticates_every_listener_and_trusts_only_the_broker(certs: CertificateSet) -> None:
    text = secure_server_properties(SecurePorts(1001, 1002, 1003, 1004), Path("/d"), certs)
    props = dict(line.split("=", 1) for line in text.splitlines() if line)
    assert props["listeners"] == ("SCRAM://127.0.0.1:1001,MTLS://127.0.0.1:1002,OAUTH://127.0.0.1:1003,"
                                  "CONTROLLER://127.0.0.1:1004")
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["listener.security.protocol.map"] == "SCRAM:SASL_SSL,MTLS:SSL,OAUTH:SASL_SSL,CONTROLLER:SSL"
    assert props["listener.name.mtls.ssl.client.auth"] == props["listener.name.controller.ssl.client.auth"] == \
        "required"
    assert props["super.users"] == "User:broker"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["listener.name.scram.sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    assert props["listener.name.oauth.sasl.enabled.mechanisms"] == "OAUTHBEARER"
    assert not any("callback.handler" in key for key in props)  # Kafka's unsecured-JWS validator
    assert props["ssl.keystore.location"] == str(certs.broker)
    assert props["log.dirs"] == "/d" and props["offsets.topic.replication.factor"] == "1"


def test_scram_users_are_made_for_both_mechanisms() -> None:
    args = scram_format_args({"worker": "a", "sink": "b"})
    assert args == ["--add-scram", "SCRAM-SHA-512=[name=worker,password=a]",
                    "--add-scram", "SCRAM-SHA-256=[name=worker,password=a]",
                    "--add-scram", "SCRAM-SHA-512=[name=sink,password=b]",
                    "--add-scram", "SCRAM-SHA-256=[name=sink,password=b]"]


def test_status_json_has_no_secrets(tmp_path: Path) -> None:
    status = SecureBrokerStatus(
        running=True, pid=1, version="3.9.2", home=tmp_path, listeners={"scram": "127.0.0.1:1"},
        ca=tmp_path / "ca.pem", certificates={}, client_properties={"worker-scram": tmp_path / "w.properties"},
        scram_passwords={"worker": "hunter2"}, oauth_client_secrets={"worker": "s3cret"})
    document = status.as_json()
    assert "hunter2" not in json.dumps(document) and "s3cret" not in json.dumps(document)
    assert document["client_properties"] == {"worker-scram": str(tmp_path / "w.properties")}
    assert status.bootstrap == "127.0.0.1:1"
    assert "hunter2" not in status.describe() and "hunter2" not in repr(status)


def test_the_sink_grant_covers_the_sink_s_default_group() -> None:
    for settings in (Settings(), Settings(topic_prefix="acme"), Settings(app_id="team-a")):
        assert default_group(settings.app_id).startswith(sink_group_prefix(settings.topology()))


def test_secure_is_a_single_broker_on_the_command_line() -> None:
    from click.testing import CliRunner

    from streamproc.cli import cli

    result = CliRunner().invoke(cli, ["broker", "start", "--secure", "--nodes", "3"])
    assert result.exit_code == 2 and "--secure starts a single broker" in result.output
