"""OAUTHBEARER tokens are reused until 80 % of their lifetime has passed, then fetched again; a file's token is
re-read; a provider can be plugged in by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.abc import AbstractTokenProvider

from streamproc.kafka import tokens
from streamproc.kafka.connection import OAuthSettings
from streamproc.kafka.tokens import FileToken, TokenError, jwt_expiry, plugged_provider, refresh_time, token_provider
from tests.unsecured_jws import unsecured_jws


def test_the_expiry_of_a_jwt_and_of_something_else() -> None:
    assert jwt_expiry(unsecured_jws("worker", exp=1_900_000_000)) == 1_900_000_000
    assert jwt_expiry("opaque-token") is None
    assert jwt_expiry("a.!!!.c") is None


def test_a_token_is_replaced_at_80_percent_of_its_lifetime() -> None:
    assert refresh_time(1000.0, 2000.0) == pytest.approx(1800.0)
    assert refresh_time(1000.0, None) == 1000.0 + tokens.UNKNOWN_LIFETIME_S
    assert refresh_time(1000.0, 900.0) == 1000.0  # already expired: at once


async def test_a_file_token_is_reread_once_its_refresh_time_has_come(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    now = [1_800_000_000.0]
    monkeypatch.setattr("time.time", lambda: now[0])
    path.write_text(unsecured_jws("worker", exp=now[0] + 100) + "\n")
    provider = FileToken(path)
    first = await provider.token()
    path.write_text(unsecured_jws("worker", exp=now[0] + 500))
    now[0] += 79
    assert await provider.token() == first  # still within 80 % of its 100 s
    now[0] += 2
    assert await provider.token() != first


async def test_an_empty_or_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    with pytest.raises(TokenError, match="is empty"):
        await FileToken(tmp_path / "empty").token()
    with pytest.raises(TokenError, match="cannot read"):
        await FileToken(tmp_path / "missing").token()


class Signer(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no type hints
    async def token(self) -> str:
        return "signed"


def make_signer() -> Signer:
    return Signer()


def test_a_provider_plugged_in_by_name() -> None:
    provider = token_provider(OAuthSettings(provider=f"{__name__}:make_signer"))
    assert isinstance(provider, Signer)
    with pytest.raises(TokenError, match="cannot load"):
        plugged_provider("no.such.module:factory")
    with pytest.raises(TokenError, match="AbstractTokenProvider"):
        plugged_provider("time:time")

