"""Which Kafka cluster to talk to and how: the configured one, else the running built-in broker.

Kept apart from the faust app so that the ops commands resolve an address without importing faust.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr, ValidationError

from streamproc.errors import UserFacingError
from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.local_address import cluster_home, local_bootstrap
from streamproc.kafka.properties import read_client_properties
from streamproc.kafka.secrets import read_secret_file
from streamproc.settings import Settings


class NoBrokerError(UserFacingError):
    """Neither a configured cluster nor a running local broker."""


def resolve_bootstrap(settings: Settings) -> str:
    """The configured cluster, else the running built-in broker (or local cluster: every node's address)."""
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    bootstrap = local_bootstrap(settings.local_stack.kafka_dir, cluster_home(settings.data_dir))
    if bootstrap is None:
        raise NoBrokerError(
            "no Kafka broker: pass -b host:port, set STREAMPROC_KAFKA_BOOTSTRAP=host:port, or start the built-in "
            "one with `streamproc broker start`"
        )
    return bootstrap


class ConnectionSettingsError(UserFacingError):
    """Connection settings that contradict each other or miss a part."""


def resolve_connection(settings: Settings) -> KafkaConnection:
    """The connection every client of this process is built from: the client properties file, then the
    ``STREAMPROC_KAFKA_*`` variables over it, then ``-b`` / the built-in broker for the address."""
    fields: dict[str, Any] = {}
    if settings.kafka_client_properties:
        fields = read_client_properties(settings.kafka_client_properties)
    overrides = _overrides(settings)
    if "oauth" in overrides and "oauth" in fields:
        overrides["oauth"] = {**fields["oauth"], **overrides["oauth"]}
    fields.update(overrides)
    fields["bootstrap"] = settings.kafka_bootstrap or fields.get("bootstrap") or resolve_bootstrap(settings)
    try:
        return KafkaConnection(**fields)
    except ValidationError as exc:
        reasons = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        raise ConnectionSettingsError(f"Kafka connection settings refused: {reasons}") from None


def _overrides(settings: Settings) -> dict[str, Any]:
    """The connection fields set by ``STREAMPROC_KAFKA_*`` variables."""
    password = settings.kafka_sasl_password
    if settings.kafka_sasl_password_file:
        password = SecretStr(read_secret_file(settings.kafka_sasl_password_file, "the Kafka SASL password"))
    plain = {
        "security_protocol": settings.kafka_security_protocol, "sasl_mechanism": settings.kafka_sasl_mechanism,
        "sasl_username": settings.kafka_sasl_username, "sasl_password": password,
        "ssl_cafile": settings.kafka_ssl_cafile, "ssl_certfile": settings.kafka_ssl_certfile,
        "ssl_keyfile": settings.kafka_ssl_keyfile, "ssl_key_password": settings.kafka_ssl_key_password,
        "ssl_check_hostname": settings.kafka_ssl_check_hostname,
    }
    fields: dict[str, Any] = {name: value for name, value in plain.items() if value is not None}
    oauth = {
        "token_file": settings.kafka_oauth_token_file, "token_endpoint_url": settings.kafka_oauth_token_endpoint_url,
        "client_id": settings.kafka_oauth_client_id, "client_secret": settings.kafka_oauth_client_secret,
        "scope": settings.kafka_oauth_scope, "provider": settings.kafka_oauth_token_provider,
    }
    if any(value is not None for value in oauth.values()):
        fields["oauth"] = {name: value for name, value in oauth.items() if value is not None}
    return fields
