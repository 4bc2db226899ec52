"""The endpoint allow-list: a record's url selects a row of the table, or is refused with the reason."""

from __future__ import annotations

import pytest

from streamproc.core.endpoints import (
    CHAT_COMPLETIONS,
    ENDPOINTS,
    Endpoint,
    UrlRefused,
    endpoint_for,
    joined_url_problem,
)

HOSTILE = [
    ("/../../admin/keys", "dot segment"),
    ("/v1/chat/completions/../files", "dot segment"),
    ("/v1/./chat/completions", "dot segment"),
    ("/v1/..", "dot segment"),
    ("/v1/%2e%2e/files", "percent-encoding at position 4"),
    ("/v1/%2E%2E/files", "percent-encoding at position 4"),
    ("/v1/chat%2Fcompletions", "percent-encoding at position 8"),
    ("/v1/chat/completions%00", "percent-encoding at position 20"),
    ("%2F%2Fevil.example/v1/chat/completions", "percent-encoding at position 0"),
    ("//evil.example/v1/chat/completions", "protocol-relative"),
    ("///evil.example/v1/chat/completions", "protocol-relative"),
    ("http://127.0.0.1:1/v1/chat/completions", "absolute url"),
    ("HTTPS://evil.example/v1/chat/completions", "absolute url"),
    ("file:/etc/passwd", "absolute url"),
    ("javascript:alert(1)", "absolute url"),
    ("\\\\v1\\\\chat\\\\completions", "backslash at position 0"),
    ("/v1\\chat/completions", "backslash at position 3"),
    ("/v1/chat/completions?x=1", "query"),
    ("/v1/chat/completions?", "query"),
    ("#frag", "fragment"),
    ("/v1/chat/completions#x", "fragment"),
    ("/v1/chat/completions\x00", "control character U+0000 at position 20"),
    ("/v1/chat/completions\n", "control character U+000A at position 20"),
    ("/v1/chat/completions\r\nHost: evil.example", "control character U+000D at position 20"),
    ("/v1/chat/completions\t", "control character U+0009"),
    ("/v1/chat/completions\x7f", "control character U+007F"),
    ("/v1/chat/completions\x85", "control character U+0085"),
    ("/v1/chat/completions\u200b", "control character U+200B"),  # zero-width space: a format character
    ("/v1\u2215chat\u2215completions", "non-ASCII character '\u2215' (U+2215) at position 3"),  # division slash
    ("/v1\uff0fchat\uff0fcompletions", "non-ASCII character"),  # fullwidth solidus
    ("/v1/chat/completions\u2024\u2024", "non-ASCII character"),  # one dot leader, twice
    ("/v1/chat/c\u043empletions", "non-ASCII character"),  # Cyrillic o
    ("/\uff0e\uff0e/admin/keys", "non-ASCII character"),  # fullwidth full stops
    ("/v1/files", "not a supported endpoint"),
    ("/v1/completions", "not a supported endpoint"),
    ("/v1/chat/completions/", "not a supported endpoint"),
    ("/V1/chat/completions", "not a supported endpoint"),
    ("/v1//chat/completions", "not a supported endpoint"),
    ("/admin/keys", "not a supported endpoint"),
    ("v1/chat/completions", "starting with /"),
    ("chat/completions", "starting with /"),
    ("", "empty"),
    (" /v1/chat/completions", "starting with /"),
]


@pytest.mark.parametrize(("url", "reason"), HOSTILE)
def test_a_hostile_url_is_refused_with_its_reason(url: str, reason: str) -> None:
    refused = endpoint_for(url)
    assert isinstance(refused, UrlRefused)
    assert reason in refused.reason
    assert str(refused).startswith(f"unsupported url {url!r}: ")


@pytest.mark.parametrize("url", [None, 5, ["/v1/chat/completions"], {"path": "/v1/chat/completions"}])
def test_a_url_that_is_not_a_string_is_refused(url: object) -> None:
    refused = endpoint_for(url)
    assert isinstance(refused, UrlRefused) and "a url is a string" in refused.reason


def test_each_row_of_the_table_is_its_own_endpoint() -> None:
    assert endpoint_for("/v1/chat/completions") == CHAT_COMPLETIONS == Endpoint("/v1/chat/completions",
                                                                              "chat/completions")
    for url, endpoint in ENDPOINTS.items():
        assert endpoint_for(url) is endpoint
        assert not endpoint.relative.startswith("/") and ".." not in endpoint.relative.split("/")


def test_a_long_url_is_shown_clipped() -> None:
    refused = endpoint_for("/v1/" + "a" * 10_000)
    assert isinstance(refused, UrlRefused) and len(str(refused)) < 400


BASE = ("https", "llm.example", 8443, "/v1/")


@pytest.mark.parametrize(("joined", "problem"), [
    (("https", "llm.example", 8443, "/v1/chat/completions", "", ""), None),
    (("http", "llm.example", 8443, "/v1/chat/completions", "", ""), "points at http://llm.example:8443"),
    (("https", "evil.example", 8443, "/v1/chat/completions", "", ""), "points at https://evil.example:8443"),
    (("https", "llm.example", None, "/v1/chat/completions", "", ""), "points at https://llm.example, not"),
    (("https", "llm.example", 8443, "/admin/keys", "", ""), "not under the base's path '/v1/'"),
    (("https", "llm.example", 8443, "/v1", "", ""), "not under"),
    (("https", "llm.example", 8443, "/v1/", "", ""), "not under"),
    (("https", "llm.example", 8443, "/v10/chat", "", ""), "not under"),
    (("https", "llm.example", 8443, "/v1/chat/completions", "x=1", ""), "query or a fragment"),
    (("https", "llm.example", 8443, "/v1/chat/completions", "", "f"), "query or a fragment"),
])
def test_a_joined_url_must_stay_under_its_base(joined: tuple[str, str, int | None, str, str, str],
                                              problem: str | None) -> None:
    found = joined_url_problem(BASE, joined)
    assert found is None if problem is None else (found is not None and problem in found)
