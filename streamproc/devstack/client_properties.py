"""Java client properties files (``kafka-console-consumer --consumer.config``, ``--command-config``) for one
principal on one listener of the secure local broker: SCRAM, mutual TLS or OAUTHBEARER over TLS."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import javaproperties

from streamproc.devstack.certificates import write_file

SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTH_LOGIN = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
OIDC_LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler"


def _jaas_value(value: str) -> str:
    """A JAAS option value in double quotes (a quote or backslash inside would end or escape it)."""
    if '"' in value or "\\" in value:
        raise ValueError(f"a JAAS option value may not contain a quote or a backslash: {value!r}")
    return f'"{value}"'


def _truststore(ca: Path) -> dict[str, str]:
    return {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca.resolve())}


def scram_properties(bootstrap: str, ca: Path, username: str, password: str,
                     mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": f"{SCRAM_LOGIN} required username={_jaas_value(username)} "
                            f"password={_jaas_value(password)};",
        **_truststore(ca),
    }


def mtls_properties(bootstrap: str, ca: Path, keystore: Path) -> dict[str, str]:
    """``keystore``: one PEM file with the PKCS#8 key and the certificate chain."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        **_truststore(ca),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore.resolve()),
    }


def oauth_properties(bootstrap: str, ca: Path, client_id: str, client_secret: str,
                     token_endpoint_url: str) -> dict[str, str]:
    """OAUTHBEARER with tokens from an OAuth client-credentials endpoint (Kafka's OIDC login handler)."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": token_endpoint_url,
        "sasl.login.callback.handler.class": OIDC_LOGIN_HANDLER,
        "sasl.jaas.config": f"{OAUTH_LOGIN} required clientId={_jaas_value(client_id)} "
                            f"clientSecret={_jaas_value(client_secret)};",
        **_truststore(ca),
    }


def unsecured_oauth_properties(bootstrap: str, ca: Path, username: str) -> dict[str, str]:
    """OAUTHBEARER with a token the Java client makes itself (``alg: none``, ``sub`` = ``username``), which is what
    the broker's unsecured validator takes. Kafka's OIDC login handler (:func:`oauth_properties`) refuses such a
    token before sending it ("expected three sections"), so Java tools reach the OAUTH listener with this file."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": f"{OAUTH_LOGIN} required unsecuredLoginStringClaim_sub={_jaas_value(username)};",
        **_truststore(ca),
    }


def _escape(text: str) -> str:
    """A key or value as java.util.Properties reads it back: only a backslash is special once the line is one
    line (``=`` and ``:`` after the first separator are kept, so the JAAS line stays as Kafka's docs write it)."""
    if any(ch in text for ch in "\r\n"):
        raise ValueError(f"a properties value may not span lines: {text!r}")
    return text.replace("\\", "\\\\")


def render_properties(properties: Mapping[str, str]) -> str:
    return "".join(f"{_escape(key)}={_escape(value)}\n" for key, value in properties.items())


def parse_properties(text: str) -> dict[str, str]:
    """A properties file as Java reads it (for tests and checks)."""
    return dict(javaproperties.loads(text))


def write_properties(path: Path, properties: Mapping[str, str]) -> Path:
    """Write with mode 0600: the files hold passwords."""
    return write_file(path, render_properties(properties).encode())
