"""Why a connection to Kafka fails, in one line a person can act on, found by opening one connection ourselves.

aiokafka logs the cause of a failed bootstrap and raises only "Unable to bootstrap": a wrong password, an
untrusted CA or a plaintext client on a TLS port would all read the same, and a worker would retry forever.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest
from cryptography import x509

from streamproc.errors import UserFacingError
from streamproc.kafka.clients import auth_options
from streamproc.kafka.connection import KafkaConnection

PROBE_TIMEOUT_S = 10.0
# OpenSSL's verify results (X509_V_ERR_*) that say the broker's certificate chain is not trusted
_UNTRUSTED = {2, 18, 19, 20, 21}
_EXPIRED = 10
_NAME_MISMATCH = {62, 64}  # host name, IP address


class KafkaRefused(UserFacingError):
    """The cluster answered, but refuses this client as configured (not a transient failure)."""


@dataclass(frozen=True)
class Failure:
    """Why a connection failed; ``lasting`` when trying again cannot help (credentials, TLS, protocol)."""

    reason: str
    lasting: bool


async def diagnose(connection: KafkaConnection, timeout_s: float = PROBE_TIMEOUT_S) -> Failure | None:
    """None when one connection to the first bootstrap address authenticates and answers a metadata request,
    else why it does not."""
    host, _, port = connection.bootstrap.split(",")[0].strip().rpartition(":")
    where = f"{host}:{port}"
    try:
        conn = await asyncio.wait_for(
            create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), api_version=(1, 0, 0),
                        **auth_options(connection)), timeout_s)
    except (TimeoutError, Exception) as exc:  # every failure is what we are here to name
        return Failure(explain(exc, connection, where), lasting=is_lasting(exc, connection))
    try:
        await asyncio.wait_for(conn.send(MetadataRequest[0]([])), timeout_s)
    except (TimeoutError, Exception) as exc:
        return Failure(explain(exc, connection, where), lasting=is_lasting(exc, connection))
    finally:
        conn.close()
    return None


def is_lasting(exc: BaseException, connection: KafkaConnection) -> bool:
    """A refusal that retrying cannot fix, as opposed to a broker that is down or slow."""
    if isinstance(exc, ssl.SSLError | KafkaRefused | SaslAuthenticationFailed | UnsupportedSaslMechanismError |
                  TopicAuthorizationFailedError):
        return True
    # a broker closes the connection at the first request of a client it refuses (a plaintext client on a TLS
    # port, failed SASL, a client certificate it does not accept), every time
    return isinstance(exc, KafkaConnectionError)


def explain(exc: BaseException, connection: KafkaConnection, where: str) -> str:
    """One line for a failure to connect; never a secret."""
    if isinstance(exc, UserFacingError):
        return str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _verify_failure(exc, connection, where)
    if isinstance(exc, ssl.SSLError):
        return _tls_alert(exc, connection, where)
    if isinstance(exc, SaslAuthenticationFailed):
        user = f" for user {connection.sasl_username!r}" if connection.sasl_username else ""
        return (f"Kafka at {where} refused SASL {connection.sasl_mechanism} authentication{user}: wrong username, "
                "password or token, or no credential for this mechanism")
    if isinstance(exc, UnsupportedSaslMechanismError):
        return (f"Kafka at {where} does not enable SASL mechanism {connection.sasl_mechanism} on this listener "
                f"({exc})")
    if isinstance(exc, TopicAuthorizationFailedError):
        return f"Kafka at {where} refused: not authorized ({exc})"
    if isinstance(exc, ConnectionRefusedError):
        return f"nothing accepts connections at {where} (is it the right host and port?)"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return (f"Kafka at {where} did not answer within {PROBE_TIMEOUT_S:g}s"
                + ("" if connection.uses_tls else " (a TLS listener waits for a handshake a PLAINTEXT client never "
                   "starts: is security.protocol right?)"))
    if isinstance(exc, KafkaConnectionError) and not connection.uses_tls and not connection.uses_sasl:
        return (f"Kafka at {where} closed the connection during the first request: the listener may expect TLS "
                f"(security protocol SSL or SASL_SSL) or SASL, not {connection.security_protocol}")
    if isinstance(exc, KafkaConnectionError) and connection.uses_sasl:
        user = f" for user {connection.sasl_username!r}" if connection.sasl_username else ""
        return (f"Kafka at {where} refused SASL {connection.sasl_mechanism} authentication{user} (it closed the "
                "connection): wrong username, password or token, or no credential for this mechanism")
    if isinstance(exc, KafkaConnectionError):
        return _client_certificate_refused(connection, where)
    if isinstance(exc, KafkaError | OSError):
        return f"Kafka at {where} is not reachable: {type(exc).__name__}: {exc}"
    return f"Kafka at {where}: {type(exc).__name__}: {exc}"


def _verify_failure(exc: ssl.SSLCertVerificationError, connection: KafkaConnection, where: str) -> str:
    trusted = f"the CA in {connection.ssl_cafile}" if connection.ssl_cafile else "the system's trust store"
    if exc.verify_code in _NAME_MISMATCH:
        return (f"the certificate of Kafka at {where} does not name that host ({exc.verify_message}); connect by a "
                "name it holds, or turn the check off with ssl.endpoint.identification.algorithm= "
                "(STREAMPROC_KAFKA_SSL_CHECK_HOSTNAME=false)")
    if exc.verify_code == _EXPIRED:
        return f"the certificate of Kafka at {where} has expired ({exc.verify_message})"
    if exc.verify_code in _UNTRUSTED:
        return (f"the certificate of Kafka at {where} is not signed by {trusted} ({exc.verify_message}): set "
                "STREAMPROC_KAFKA_SSL_CAFILE (ssl.truststore.location) to the cluster's CA")
    return f"the certificate of Kafka at {where} is refused: {exc.verify_message}"


def _tls_alert(exc: ssl.SSLError, connection: KafkaConnection, where: str) -> str:
    reason = (exc.reason or str(exc)).upper()
    if "CERTIFICATE_EXPIRED" in reason:
        return f"Kafka at {where} refused our client certificate {connection.ssl_certfile}: it has expired"
    if "CERTIFICATE_REQUIRED" in reason or ("HANDSHAKE_FAILURE" in reason and not connection.ssl_certfile):
        return (f"Kafka at {where} requires a client certificate (mTLS): set STREAMPROC_KAFKA_SSL_CERTFILE "
                "(ssl.keystore.location)")
    if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
        return f"Kafka at {where} does not trust our client certificate {connection.ssl_certfile} ({exc.reason})"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason or "PACKET_LENGTH_TOO_LONG" in reason:
        return f"Kafka at {where} does not speak TLS on this port ({exc.reason}): is security.protocol right?"
    return f"TLS with Kafka at {where} failed: {exc.reason or exc}"


def _client_certificate_refused(connection: KafkaConnection, where: str) -> str:
    """A TLS listener that closes the connection after the handshake refused the client's certificate (with TLS
    1.3 the client learns it only then): say what is wrong with ours when it can be seen here."""
    if connection.ssl_certfile is None:
        return (f"Kafka at {where} closed the connection after the TLS handshake: the listener requires a client "
                "certificate (mTLS): set STREAMPROC_KAFKA_SSL_CERTFILE (ssl.keystore.location)")
    expiry = certificate_expiry(connection.ssl_certfile)
    if expiry is not None and expiry < datetime.now(UTC):
        return (f"Kafka at {where} refused our client certificate {connection.ssl_certfile}: it expired on "
                f"{expiry:%Y-%m-%d %H:%M} UTC")
    return (f"Kafka at {where} refused our client certificate {connection.ssl_certfile} (closed the connection "
            "after the TLS handshake): is it signed by a CA the cluster trusts?")


def certificate_expiry(path: Path) -> datetime | None:
    """When the first certificate of a PEM file expires; None when it cannot be read."""
    try:
        certificate = x509.load_pem_x509_certificates(path.read_bytes())[0]
    except (OSError, ValueError, IndexError):
        return None
    return certificate.not_valid_after_utc


async def refuse_unless_connectable(connection: KafkaConnection) -> None:
    """Raise :class:`KafkaRefused` with the reason when the cluster refuses this client."""
    failure = await diagnose(connection)
    if failure is not None:
        raise KafkaRefused(failure.reason)
