"""Which base URLs would carry the key over the network in clear text."""

from __future__ import annotations

import pytest

from streamproc.core.plain_http import plain_http_host


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/v1", "http://127.8.9.10/v1", "http://localhost:8000/v1", "http://LOCALHOST./v1",
    "http://[::1]:8000/v1", "http://[::ffff:127.0.0.1]:80/v1", "http://api.localhost/v1",
    "https://api.openai.com/v1", "https://10.0.0.5/v1", "ftp://x/", "not a url",
])
def test_loopback_and_https_are_fine(url: str) -> None:
    assert plain_http_host(url) is None


@pytest.mark.parametrize(("url", "host"), [
    ("http://api.openai.com/v1", "api.openai.com"), ("HTTP://10.0.0.5:8000/v1", "10.0.0.5"),
    ("http://[2001:db8::1]/v1", "2001:db8::1"), ("http://user:pw@llm.internal/v1", "llm.internal"),
    ("http://0.0.0.0:8000/v1", "0.0.0.0"), ("http://localhost.evil.example/v1", "localhost.evil.example"),
])
def test_plain_http_elsewhere_is_named(url: str, host: str) -> None:
    assert plain_http_host(url) == host
