"""A throwaway certificate authority for the secure local broker: the broker's certificate, one client certificate
per principal, and two that must be refused (an expired one, one from another CA) for failure tests.

Every file is PEM, readable by Java (``ssl.keystore.type=PEM``: a PKCS#8 key followed by the certificate chain)
and by Python's ``ssl`` (``load_cert_chain(path)``). Keys are ECDSA P-256: quick to make, accepted by both.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BROKER_CN = "broker"
"""The broker's own principal (``User:broker``) once ``ssl.principal.mapping.rules`` takes the CN."""

_VALID_FOR = dt.timedelta(days=365)
_COMPLETE = ".complete"


@dataclass(frozen=True)
class CertificateSet:
    """Where the files are. ``keystores`` maps a principal to its key + certificate chain file."""

    directory: Path
    ca: Path
    broker: Path
    keystores: Mapping[str, Path]
    expired: Path
    """A client certificate for ``worker`` from the right CA whose validity ended yesterday."""
    other_ca: Path
    """A CA certificate unrelated to the broker's: as a truststore, it must make the broker's certificate fail."""
    other_ca_client: Path
    """A ``worker`` client key + certificate signed by the other CA: the broker must refuse it."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 without a password: the only private key form Kafka's PEM keystore reads unencrypted."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class _Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str, now: dt.datetime) -> _Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def issue(self, common_name: str, not_before: dt.datetime, not_after: dt.datetime, server: bool = False,
              ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A leaf certificate; a server one names 127.0.0.1 and localhost and may also be a client (the broker
        connects to its own controller and inter-broker listeners with it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server else \
            [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return key, builder.sign(self.key, hashes.SHA256())

    def keystore(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bytes:
        """Key, then the chain up to this CA: the layout Kafka's PEM keystore and Python's ``ssl`` expect."""
        return _key_pem(key) + _cert_pem(cert) + _cert_pem(self.cert)


def write_file(path: Path, data: bytes, private: bool = True) -> Path:
    """Replace ``path``, created with mode 0600 from the start when it holds a secret (a key, a password)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


def certificate_set(directory: Path, principals: Iterable[str]) -> CertificateSet:
    """The file names under ``directory`` (made or not)."""
    return CertificateSet(
        directory=directory, ca=directory / "ca.pem", broker=directory / f"{BROKER_CN}.pem",
        keystores={name: directory / f"{name}.pem" for name in principals},
        expired=directory / "worker-expired.pem", other_ca=directory / "other-ca.pem",
        other_ca_client=directory / "worker-other-ca.pem",
    )


def ensure_certificates(directory: Path, principals: Iterable[str], now: dt.datetime | None = None) -> CertificateSet:
    """Make the CA and every certificate under ``directory`` once (a restarted broker keeps the CA its clients
    trust); a half-made set is made again whole. The CA's key stays in ``ca-key.pem`` (0600)."""
    files = certificate_set(directory, principals)
    if (directory / _COMPLETE).exists() and all(path.exists() for path in files.keystores.values()):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    now = now or dt.datetime.now(dt.UTC)
    ca = _Authority.create("streamproc local CA", now)
    write_file(directory / "ca-key.pem", _key_pem(ca.key), private=True)
    write_file(files.ca, _cert_pem(ca.cert), private=False)
    start, end = now - dt.timedelta(minutes=5), now + _VALID_FOR
    write_file(files.broker, ca.keystore(*ca.issue(BROKER_CN, start, end, server=True)), private=True)
    for name, path in files.keystores.items():
        write_file(path, ca.keystore(*ca.issue(name, start, end)), private=True)
    expired = ca.issue("worker", now - dt.timedelta(days=30), now - dt.timedelta(days=1))
    write_file(files.expired, ca.keystore(*expired), private=True)
    other = _Authority.create("streamproc other CA", now)
    write_file(files.other_ca, _cert_pem(other.cert), private=False)
    write_file(files.other_ca_client, other.keystore(*other.issue("worker", start, end)), private=True)
    (directory / _COMPLETE).write_text("")
    return files
