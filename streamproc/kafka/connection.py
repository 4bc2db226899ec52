"""The one value every Kafka client is built from: where the cluster is and how to prove who we are to it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class OAuthSettings(BaseModel):
    """Where OAUTHBEARER tokens come from: exactly one of a token file (re-read before it expires), an OIDC
    client-credentials endpoint, or a provider plugged in by name (``package.module:factory``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_file: Path | None = None
    token_endpoint_url: str | None = None
    client_id: str | None = None
    client_secret: SecretStr | None = None
    scope: str | None = None
    provider: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> OAuthSettings:
        sources = [name for name, value in (("a token file", self.token_file),
                                            ("a token endpoint", self.token_endpoint_url),
                                            ("a token provider", self.provider)) if value]
        if len(sources) != 1:
            raise ValueError("OAUTHBEARER needs exactly one token source (STREAMPROC_KAFKA_OAUTH_TOKEN_FILE, "
                             "STREAMPROC_KAFKA_OAUTH_TOKEN_ENDPOINT_URL or STREAMPROC_KAFKA_OAUTH_TOKEN_PROVIDER)"
                             + (f"; got {' and '.join(sources)}" if sources else ""))
        if self.token_endpoint_url and not (self.client_id and self.client_secret):
            raise ValueError("an OAUTHBEARER token endpoint needs a client id and a client secret")
        return self


class KafkaConnection(BaseModel):
    """A cluster's address and the client's security: TLS (server CA, optional client certificate for mTLS)
    and SASL (PLAIN, SCRAM or OAUTHBEARER). Frozen and hashable, so a built TLS context or token provider is
    shared by every client of one connection."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_cadata: str | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    oauth: OAuthSettings | None = None

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        if self.uses_sasl:
            if self.sasl_mechanism is None:
                raise ValueError(f"{self.security_protocol} needs a SASL mechanism (STREAMPROC_KAFKA_SASL_MECHANISM "
                                 "or sasl.mechanism): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
            if self.sasl_mechanism == "OAUTHBEARER":
                if self.oauth is None:
                    raise ValueError("OAUTHBEARER needs a token source (STREAMPROC_KAFKA_OAUTH_TOKEN_FILE, "
                                     "STREAMPROC_KAFKA_OAUTH_TOKEN_ENDPOINT_URL or "
                                     "STREAMPROC_KAFKA_OAUTH_TOKEN_PROVIDER)")
            elif not (self.sasl_username and self.sasl_password):
                raise ValueError(f"SASL {self.sasl_mechanism} needs a username and a password "
                                 "(STREAMPROC_KAFKA_SASL_USERNAME, STREAMPROC_KAFKA_SASL_PASSWORD or _PASSWORD_FILE)")
        elif self.sasl_mechanism is not None:
            raise ValueError(f"a SASL mechanism ({self.sasl_mechanism}) needs security protocol SASL_SSL or "
                             f"SASL_PLAINTEXT, not {self.security_protocol}")
        tls_files = [self.ssl_cafile, self.ssl_cadata, self.ssl_certfile, self.ssl_keyfile]
        if not self.uses_tls and any(tls_files):
            raise ValueError(f"TLS files are set but security protocol {self.security_protocol} does not use TLS "
                             "(use SSL or SASL_SSL)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("a client key needs its certificate (STREAMPROC_KAFKA_SSL_CERTFILE)")
        return self

    def describe(self) -> str:
        """The connection for a log line or an error: address, protocol, mechanism, user; never a secret."""
        parts: list[str] = [self.security_protocol]
        if self.sasl_mechanism:
            parts.append(self.sasl_mechanism + (f" as {self.sasl_username}" if self.sasl_username else ""))
        if self.ssl_certfile:
            parts.append("client certificate")
        return f"{self.bootstrap} ({', '.join(parts)})"
