"""OAUTHBEARER tokens for aiokafka's token-provider seam: from a file, from an OIDC client-credentials endpoint,
or from a provider plugged in by name (e.g. a cloud signer such as Amazon MSK's IAM token generator)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import importlib
import json
import time
from pathlib import Path

import httpx
from aiokafka.abc import AbstractTokenProvider

from streamproc.errors import UserFacingError
from streamproc.kafka.connection import OAuthSettings

# a token is replaced once this share of its lifetime has passed (Kafka's sasl.login.refresh.window.factor)
REFRESH_AT = 0.8
# a token whose lifetime cannot be read is re-read this often
UNKNOWN_LIFETIME_S = 60.0


class TokenError(UserFacingError):
    """No OAUTHBEARER token could be had."""


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim (epoch seconds) of a JWT, or None when the token is not a JWT with one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def refresh_time(now: float, expires_at: float | None) -> float:
    """When a token got at ``now`` is to be replaced."""
    if expires_at is None:
        return now + UNKNOWN_LIFETIME_S
    return now + max(0.0, expires_at - now) * REFRESH_AT


class _Refreshing(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no type hints
    """A cached token, replaced when its refresh time has come; one fetch at a time."""

    def __init__(self) -> None:
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:
            if self._token is None or time.time() >= self._refresh_at:
                self._token, expires_at = await self._fetch()
                self._refresh_at = refresh_time(time.time(), expires_at)
            return self._token

    async def _fetch(self) -> tuple[str, float | None]:
        raise NotImplementedError


class FileToken(_Refreshing):
    """A token another process keeps fresh in a file (a sidecar, a Kubernetes projected token)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path

    async def _fetch(self) -> tuple[str, float | None]:
        try:
            token = self._path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise TokenError(f"cannot read the OAUTHBEARER token file {self._path}: {exc.strerror or exc}") from exc
        if not token:
            raise TokenError(f"the OAUTHBEARER token file {self._path} is empty")
        return token, jwt_expiry(token)


class ClientCredentialsToken(_Refreshing):
    """OAuth 2 client credentials (RFC 6749 §4.4) against a token endpoint, as Kafka's OIDC login handler does."""

    def __init__(self, url: str, client_id: str, client_secret: str, scope: str | None) -> None:
        super().__init__()
        self._url, self._scope = url, scope
        self._auth = httpx.BasicAuth(client_id, client_secret)

    async def _fetch(self) -> tuple[str, float | None]:
        form = {"grant_type": "client_credentials", **({"scope": self._scope} if self._scope else {})}
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                response = await client.post(self._url, data=form, auth=self._auth)
        except httpx.HTTPError as exc:
            raise TokenError(f"OAUTHBEARER token endpoint {self._url} is not reachable: {exc!r}") from exc
        if response.status_code != 200:
            raise TokenError(f"OAUTHBEARER token endpoint {self._url} answered {response.status_code}: "
                             f"{response.text[:200]}")
        try:
            body = response.json()
            token = body["access_token"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenError(f"OAUTHBEARER token endpoint {self._url} gave no access_token") from exc
        expires_in = body.get("expires_in")
        expires_at = time.time() + float(expires_in) if isinstance(expires_in, int | float) else jwt_expiry(token)
        return str(token), expires_at


def plugged_provider(spec: str) -> AbstractTokenProvider:
    """``package.module:factory``: the factory is called without arguments and returns the provider."""
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TokenError(f"cannot load the OAUTHBEARER token provider {spec!r} (package.module:factory): "
                         f"{exc}") from exc
    provider = factory()
    if not isinstance(provider, AbstractTokenProvider):
        raise TokenError(f"{spec} did not return an aiokafka AbstractTokenProvider")
    return provider


def token_provider(oauth: OAuthSettings) -> AbstractTokenProvider:
    """The provider of the configured token source."""
    if oauth.provider:
        return plugged_provider(oauth.provider)
    if oauth.token_file:
        return FileToken(oauth.token_file)
    assert oauth.token_endpoint_url and oauth.client_id and oauth.client_secret  # OAuthSettings checks it
    return ClientCredentialsToken(oauth.token_endpoint_url, oauth.client_id, oauth.client_secret.get_secret_value(),
                                  oauth.scope)
