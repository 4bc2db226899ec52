"""The only constructors of Kafka clients in streamproc: each takes the :class:`KafkaConnection`, so no client
is ever built from a bare address (tests/unit/kafka/test_client_sites.py fails on any other construction)."""

from __future__ import annotations

import functools
import ssl
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context

from streamproc.errors import UserFacingError
from streamproc.kafka.connection import KafkaConnection


class TlsFilesError(UserFacingError):
    """A CA, certificate or key file that cannot be loaded."""


@functools.cache
def tls_context(connection: KafkaConnection) -> ssl.SSLContext | None:
    """The TLS context of a connection (one per connection: building it reads files), None without TLS."""
    if not connection.uses_tls:
        return None
    password = connection.ssl_key_password.get_secret_value() if connection.ssl_key_password else None
    try:
        context = create_ssl_context(cafile=connection.ssl_cafile, cadata=connection.ssl_cadata,
                                     certfile=connection.ssl_certfile, keyfile=connection.ssl_keyfile,
                                     password=password)
    except FileNotFoundError as exc:
        raise TlsFilesError(f"Kafka TLS file not found: {exc.filename}") from exc
    except ssl.SSLError as exc:
        raise TlsFilesError(f"Kafka TLS files cannot be loaded ({exc.reason or exc}): check the CA, certificate, "
                            "key and key password") from exc
    context.check_hostname = connection.ssl_check_hostname
    return cast(ssl.SSLContext, context)


@functools.cache
def shared_token_provider(connection: KafkaConnection) -> AbstractTokenProvider | None:
    """One provider per connection, so every client shares its cached token."""
    if not connection.oauth:
        return None
    from streamproc.kafka.tokens import token_provider  # httpx (and what it loads) only for OAUTHBEARER

    return token_provider(connection.oauth)


def auth_options(connection: KafkaConnection) -> dict[str, Any]:
    """The keyword arguments aiokafka's producer, consumer and admin client take for the connection's security."""
    options: dict[str, Any] = {"security_protocol": connection.security_protocol}
    context = tls_context(connection)
    if context is not None:
        options["ssl_context"] = context
    if connection.uses_sasl:
        options["sasl_mechanism"] = connection.sasl_mechanism
        if connection.sasl_mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = shared_token_provider(connection)
        else:
            options["sasl_plain_username"] = connection.sasl_username
            options["sasl_plain_password"] = (connection.sasl_password.get_secret_value()
                                              if connection.sasl_password else None)
    return options


def kafka_producer(connection: KafkaConnection, **options: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=connection.bootstrap, **auth_options(connection), **options)


def kafka_consumer(connection: KafkaConnection, *topics: str, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(*topics, bootstrap_servers=connection.bootstrap, **auth_options(connection), **options)


def kafka_admin(connection: KafkaConnection, **options: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=connection.bootstrap, **auth_options(connection), **options)
