"""The LLM key from the environment or a file, checked as any secret is, and never sent over plain http to a
host that is not loopback (unless allowed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamproc.errors import ExitCode
from streamproc.kafka.secrets import SecretFileError
from streamproc.llm.api_key import InsecureEndpointError, check_llm_key, llm_api_key
from streamproc.settings import LLMEndpoint, Settings

KEY = "sk-file-key-0123456789"


def endpoint(**settings: Any) -> LLMEndpoint:
    """The LLM endpoint as the worker is given it, from the settings of those (variable) names."""
    return Settings(**settings).llm_endpoint


def key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llm-key"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text", [KEY, KEY + "\n"])
def test_the_key_is_read_from_its_file(tmp_path: Path, text: str) -> None:
    assert llm_api_key(endpoint(llm_api_key_file=key_file(tmp_path, text))) == KEY


def test_the_file_is_named_by_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMPROC_LLM_API_KEY", raising=False)
    monkeypatch.setenv("STREAMPROC_LLM_API_KEY_FILE", str(key_file(tmp_path, KEY + "\n")))
    assert llm_api_key(endpoint()) == KEY


@pytest.mark.parametrize(("text", "why"), [
    ("sk-with space", "whitespace or a control character at position 8"),
    ("sk-two\nlines", "whitespace or a control character at position 7"),
    (KEY + "\n\n", "whitespace or a control character"),
    ("sk-tab\there", "whitespace or a control character"),
    ("", "is empty"),
    ("\n", "is empty"),
])
def test_a_key_file_that_cannot_hold_a_key_is_refused_without_echoing_it(tmp_path: Path, text: str,
                                                                         why: str) -> None:
    with pytest.raises(SecretFileError, match=why) as raised:
        llm_api_key(endpoint(llm_api_key_file=key_file(tmp_path, text)))
    assert "STREAMPROC_LLM_API_KEY_FILE" in str(raised.value)
    assert text.strip() == "" or text.strip() not in str(raised.value)
    assert raised.value.exit_code == ExitCode.CONFIGURATION


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="cannot read the LLM key"):
        llm_api_key(endpoint(llm_api_key_file=tmp_path / "absent"))


@pytest.mark.parametrize("value", ["sk-with space", "sk-ctl\x01x", " sk-lead"])
def test_the_variable_is_checked_the_same_way(value: str) -> None:
    with pytest.raises(SecretFileError, match="STREAMPROC_LLM_API_KEY holds whitespace") as raised:
        llm_api_key(endpoint(llm_api_key=value))
    assert value not in str(raised.value)


def test_both_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="STREAMPROC_LLM_API_KEY or STREAMPROC_LLM_API_KEY_FILE, not both"):
        llm_api_key(endpoint(llm_api_key=KEY, llm_api_key_file=key_file(tmp_path, KEY)))


def test_no_key_is_none() -> None:
    assert llm_api_key(endpoint()) is None


@pytest.mark.parametrize("url", ["http://api.example.com/v1", "http://10.1.2.3:8000/v1", "HTTP://[2001:db8::1]/v1"])
def test_a_key_over_plain_http_elsewhere_is_refused(url: str) -> None:
    with pytest.raises(InsecureEndpointError, match="STREAMPROC_LLM_ALLOW_INSECURE=1") as raised:
        check_llm_key(endpoint(llm_base_url=url, llm_api_key=KEY))
    assert KEY not in str(raised.value) and "\n" not in str(raised.value)
    assert raised.value.exit_code == ExitCode.CONFIGURATION


@pytest.mark.parametrize("url", ["http://127.0.0.1:8100/v1", "http://localhost:8000/v1", "http://[::1]:9/v1",
                                 "https://api.example.com/v1"])
def test_loopback_and_https_are_allowed(url: str) -> None:
    assert check_llm_key(endpoint(llm_base_url=url, llm_api_key=KEY)) == KEY


def test_allow_insecure_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROC_LLM_ALLOW_INSECURE", "1")
    assert check_llm_key(endpoint(llm_base_url="http://llm.internal/v1", llm_api_key=KEY)) == KEY


def test_plain_http_without_a_key_is_allowed() -> None:
    assert check_llm_key(endpoint(llm_base_url="http://mock-llm:8100/v1")) is None
