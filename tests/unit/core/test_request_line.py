"""The request object read by submit's lines and the worker's JSON records: the envelope a caller allows."""

from __future__ import annotations

import pytest

from streamproc.core.request_line import InvalidLine, LineLimits, RequestLine, read_request

LINE = {"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


def test_the_envelope_fields_a_caller_allows_are_given_back_as_they_came() -> None:
    line = read_request({**LINE, "tenant": "t", "batch_id": "b"}, LineLimits(), envelope=("batch_id", "tenant",
                                                                                          "priority"))
    assert line == RequestLine("r", "/v1/chat/completions",
                               '{"model":"m","messages":[{"role":"user","content":"hi"}]}',
                               {"batch_id": "b", "tenant": "t"})


def test_without_an_envelope_the_same_fields_are_unknown() -> None:
    with pytest.raises(InvalidLine) as refused:
        read_request({**LINE, "tenant": "t"}, LineLimits())
    assert refused.value.reason.startswith("unknown field 'tenant' (OpenAI batch form")
    assert "beside either" not in refused.value.reason and refused.value.custom_id == "r"


def test_an_envelope_is_named_in_the_reason_for_an_unknown_field() -> None:
    with pytest.raises(InvalidLine) as refused:
        read_request({**LINE, "tenantt": "t"}, LineLimits(), envelope=("tenant",))
    assert refused.value.reason.endswith("; beside either: tenant)")


def test_an_envelope_alone_is_no_request() -> None:
    with pytest.raises(InvalidLine, match="empty object"):
        read_request({"tenant": "t"}, LineLimits(), envelope=("tenant",))
