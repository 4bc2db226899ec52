"""Credentials taken out of text that reaches logs, failure records, exports and the database."""

from __future__ import annotations

import pytest

from streamproc.core.redact import REDACTED, redact, redact_bytes

KEY = "k3y-0f-th1s-d3pl0yment"


@pytest.mark.parametrize(("text", "expected"), [
    ("Incorrect API key provided: Bearer abc.def-ghi", "Incorrect API key provided: Bearer [REDACTED]"),
    ("authorization: bearer xyz", "authorization: [REDACTED]"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: [REDACTED]"),
    ('{"headers": {"Authorization": "Bearer sk-abc"}, "n": 1}', '{"headers": {"Authorization": "[REDACTED]"}, "n": 1}'),
    ("{'authorization': 'Bearer q'}", "{'authorization': '[REDACTED]'}"),
    ("Proxy-Authorization: Basic Zm9v", "Proxy-Authorization: [REDACTED]"),
    ("x-api-key: abc123", "x-api-key: [REDACTED]"),
    ('api-key="abc123"', 'api-key="[REDACTED]"'),
    ("the key sk-proj-AbCdEf0123456789 is wrong", "the key [REDACTED] is wrong"),
    ("sk-ant-api03-abcdefgh", "[REDACTED]"),
    (f"you sent {KEY}.", "you sent [REDACTED]."),
    ("GET https://user:pa55@llm.example/v1 failed", "GET https://[REDACTED]@llm.example/v1 failed"),
    ("kafka://svc:secret@broker:9092", "kafka://[REDACTED]@broker:9092"),
    ("https://token@host/x", "https://[REDACTED]@host/x"),
])
def test_credentials_are_replaced(text: str, expected: str) -> None:
    assert redact(text, [KEY]) == expected
    assert KEY not in redact(text, [KEY])


@pytest.mark.parametrize("text", [
    "HTTP 429 rate_limit_exceeded: Rate limit reached for gpt-4o-mini in organization org-1 on tokens",
    "the model mock-small does not exist",
    "scikit sk-learn is a library",
    "mail me at someone@example.com",
    "https://llm.example/v1/chat/completions",
    "",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text, [KEY]) == text


def test_a_very_short_secret_is_not_taken_out_of_every_word() -> None:
    assert redact("a1 b2 abc", ["a1"]) == "a1 b2 abc"
    assert redact("key wxyz!", ["wxyz"]) == f"key {REDACTED}!"


def test_a_longer_secret_is_replaced_before_a_shorter_one_it_contains() -> None:
    assert redact("abcdefgh", ["abcd", "abcdefgh"]) == REDACTED


def test_redacting_twice_changes_nothing_more() -> None:
    once = redact(f"Authorization: Bearer {KEY} and Bearer zz", [KEY])
    assert redact(once, [KEY]) == once


def test_bytes_keep_their_invalid_utf8_and_json_stays_json() -> None:
    body = b'{"error": {"message": "bad key Bearer ' + KEY.encode() + b'"}}\xff'
    assert redact_bytes(body, [KEY]) == b'{"error": {"message": "bad key Bearer [REDACTED]"}}\xff'
    plain = b'{"ok": true}\xfe'
    assert redact_bytes(plain, [KEY]) is plain
