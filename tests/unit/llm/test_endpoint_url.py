"""Joining the endpoint table under the base URL: a real join, checked to stay under the base."""

from __future__ import annotations

import httpx
import pytest

from streamproc.core.endpoints import CHAT_COMPLETIONS, Endpoint
from streamproc.llm.endpoint_url import endpoint_url, endpoint_urls


@pytest.mark.parametrize(("base", "joined"), [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/chat/completions"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"),
    ("https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
    ("https://gateway.example/openai/deployments/v1", "https://gateway.example/openai/deployments/v1/chat/completions"),
    ("http://llm.example", "http://llm.example/chat/completions"),
    ("http://llm.example:80/v1", "http://llm.example/v1/chat/completions"),
])
def test_the_endpoint_is_joined_under_the_base(base: str, joined: str) -> None:
    assert endpoint_url(base, CHAT_COMPLETIONS) == httpx.URL(joined)
    assert endpoint_urls(base) == {CHAT_COMPLETIONS: httpx.URL(joined)}


@pytest.mark.parametrize(("relative", "problem"), [
    ("../admin/keys", "not under the base's path '/v1/'"),
    ("../../../admin/keys", "not under the base's path"),
    ("/admin/keys", "not under the base's path"),
    ("//evil.example/v1/chat/completions", "points at http://evil.example"),
    ("http://127.0.0.1:1/v1/chat/completions", "points at http://127.0.0.1:1"),
    ("https://llm.example:8000/v1/chat/completions", "points at https://llm.example:8000"),
    ("chat/completions?x=1", "query or a fragment"),
    ("chat/completions#f", "query or a fragment"),
])
def test_a_row_that_would_leave_the_base_fails_at_start(relative: str, problem: str) -> None:
    """The table is ours, yet a bad row must fail the worker at start rather than send the key elsewhere."""
    with pytest.raises(ValueError, match="under STREAMPROC_LLM_BASE_URL") as raised:
        endpoint_url("http://llm.example:8000/v1", Endpoint("/v1/x", relative))
    assert problem in str(raised.value)


@pytest.mark.parametrize(("base", "problem"), [
    ("ftp://llm.example/v1", "not an http(s) URL"),
    ("llm.example/v1", "not an http(s) URL"),
    ("https://llm.example/v1?api-version=1", "query or a fragment"),
    ("https://llm.example/v1#x", "query or a fragment"),
])
def test_an_unusable_base_url_is_refused(base: str, problem: str) -> None:
    with pytest.raises(ValueError, match="STREAMPROC_LLM_BASE_URL") as raised:
        endpoint_url(base, CHAT_COMPLETIONS)
    assert problem in str(raised.value)
