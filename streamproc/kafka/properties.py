"""A Java client properties file (the one ``kafka-console-consumer --consumer.config`` reads) as connection fields.

Every key is either understood or refused by name: a setting silently ignored is a connection that is not
what its owner believes it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamproc.errors import UserFacingError

_OAUTH_LOGIN_HANDLERS = frozenset({
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
})
_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule": "OAUTHBEARER",
}
# accepted because streamproc already behaves so; any other value is refused
_FIXED = {
    "client.dns.lookup": ({"use_all_dns_ips"}, "streamproc's client tries every address a name resolves to"),
    "acks": ({"all", "-1"}, "streamproc always writes with acks=all"),
}
_JAAS_OPTION = re.compile(r'\s*([A-Za-z_][\w.]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


class ClientPropertiesError(UserFacingError):
    """A client properties file streamproc cannot honour as written."""


def read_client_properties(path: Path) -> dict[str, Any]:
    """The connection fields a properties file gives (keys of :class:`KafkaConnection`, ``oauth`` a dict)."""
    import javaproperties  # only with STREAMPROC_KAFKA_CONFIG: it costs every command a tenth of a second

    try:
        with path.open(encoding="utf-8") as file:
            properties = javaproperties.load(file)
    except OSError as exc:
        raise ClientPropertiesError(f"cannot read client properties {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise ClientPropertiesError(f"client properties {path} are not a properties file: {exc}") from exc
    try:
        return connection_fields(properties)
    except ClientPropertiesError as exc:
        raise ClientPropertiesError(f"{path}: {exc}") from exc


def connection_fields(properties: Mapping[str, str]) -> dict[str, Any]:
    """:func:`read_client_properties` for properties already parsed."""
    fields: dict[str, Any] = {}
    oauth: dict[str, Any] = {}
    for key, raw in properties.items():
        value = raw.strip()
        if key == "bootstrap.servers":
            fields["bootstrap"] = value
        elif key == "security.protocol":
            fields["security_protocol"] = value.upper()
        elif key == "sasl.mechanism":
            fields["sasl_mechanism"] = value.upper()
        elif key == "sasl.jaas.config":
            _read_jaas(value, fields, oauth)
        elif key == "sasl.login.callback.handler.class":
            if value not in _OAUTH_LOGIN_HANDLERS:
                raise ClientPropertiesError(f"unsupported {key}={value}: only Kafka's OIDC login handler is known; "
                                            "plug another token source in with STREAMPROC_KAFKA_OAUTH_TOKEN_PROVIDER")
        elif key == "sasl.oauthbearer.token.endpoint.url":
            if value.startswith("file:"):
                oauth["token_file"] = Path(value.removeprefix("file://").removeprefix("file:"))
            else:
                oauth["token_endpoint_url"] = value
        elif key in ("ssl.truststore.type", "ssl.keystore.type"):
            if value.upper() != "PEM":
                raise ClientPropertiesError(f"unsupported {key}={value}: streamproc reads PEM files; convert the store "
                                            "with `keytool -importkeystore ... -deststoretype PKCS12` and "
                                            "`openssl pkcs12 -nodes` to PEM")
        elif key == "ssl.truststore.location":
            fields["ssl_cafile"] = Path(value)
        elif key == "ssl.truststore.certificates":
            fields["ssl_cadata"] = value
        elif key == "ssl.keystore.location":
            fields["ssl_certfile"] = Path(value)  # a PEM keystore holds the key and its certificate chain
        elif key == "ssl.key.password":
            fields["ssl_key_password"] = value
        elif key == "ssl.endpoint.identification.algorithm":
            if value.lower() not in ("https", ""):
                raise ClientPropertiesError(f"unsupported {key}={value} (https, or empty to skip the hostname check)")
            fields["ssl_check_hostname"] = value.lower() == "https"
        elif key in _FIXED and value.lower() in _FIXED[key][0]:
            continue
        elif key in _FIXED:
            raise ClientPropertiesError(f"unsupported {key}={value}: {_FIXED[key][1]}")
        else:
            raise ClientPropertiesError(f"unsupported client property {key!r} (streamproc reads bootstrap.servers, "
                                        "security.protocol, sasl.*, ssl.* with PEM files)")
    if oauth:
        fields["oauth"] = oauth
    return fields


def _read_jaas(config: str, fields: dict[str, Any], oauth: dict[str, Any]) -> None:
    """``<LoginModule> required key="value" ...;`` into the fields of its mechanism."""
    module, _, rest = config.strip().partition(" ")
    kind = _LOGIN_MODULES.get(module)
    if kind is None:
        raise ClientPropertiesError(f"unsupported sasl.jaas.config login module {module!r} (PLAIN, SCRAM and "
                                    "OAUTHBEARER modules are read; a cloud signer plugs in with "
                                    "STREAMPROC_KAFKA_OAUTH_TOKEN_PROVIDER)")
    flag, _, options_text = rest.strip().partition(" ")
    if flag != "required":
        raise ClientPropertiesError(f"sasl.jaas.config: the login module must be 'required', not {flag!r}")
    options = _jaas_options(options_text)
    if kind in ("PLAIN", "SCRAM"):
        unknown = set(options) - {"username", "password"}
        if unknown:
            raise ClientPropertiesError(f"sasl.jaas.config: unsupported option(s) {', '.join(sorted(unknown))}")
        fields["sasl_username"] = options.get("username")
        fields["sasl_password"] = options.get("password")
        return
    renamed = {"clientId": "client_id", "clientSecret": "client_secret", "scope": "scope"}
    unknown = set(options) - set(renamed)
    if unknown:
        raise ClientPropertiesError(f"sasl.jaas.config: unsupported OAUTHBEARER option(s) {', '.join(sorted(unknown))}")
    oauth.update({renamed[name]: value for name, value in options.items()})


def _jaas_options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    rest = text.strip().removesuffix(";").strip()
    while rest:
        match = _JAAS_OPTION.match(rest)
        if match is None:
            raise ClientPropertiesError("sasl.jaas.config: cannot read the options after the login module "
                                        '(expected key="value" pairs ending with ;)')
        quoted, bare = match.group(2), match.group(3)
        options[match.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        rest = rest[match.end():].strip()
    return options
