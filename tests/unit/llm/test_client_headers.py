"""What the client adds to every call must be accepted by servers it did not write."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.llm.client import CLIENT_REQUEST_ID, correlation_headers


@pytest.mark.parametrize(
    "request_id", ["batch-1:request-7", "b\u00e4tch/\u65e5\u672c", "50%-off", " spaced id ", "x" * 600])
def test_the_correlation_id_is_printable_ascii_bounded_and_decodes_back(request_id: str) -> None:
    headers = correlation_headers(InferenceRequest(request_id, "{}"))
    value = headers[CLIENT_REQUEST_ID]
    assert value.isascii() and value.isprintable() and " " not in value
    assert len(value) <= 512  # OpenAI's limit for x-client-request-id
    if len(request_id) <= 100:
        assert unquote(value) == request_id


def test_no_x_request_id_is_sent() -> None:
    """llama-cpp-python's server refuses an x-request-id that is not a UUID with an empty 400."""
    assert {name.lower() for name in correlation_headers(InferenceRequest("custom-1", "{}"))} == {CLIENT_REQUEST_ID}
