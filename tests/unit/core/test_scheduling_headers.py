"""The headers a request record is scheduled by."""

from __future__ import annotations

import json

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.long_requests import SIZE_HEADER, estimated_size
from streamproc.core.scheduling_headers import scheduling_headers


def test_a_default_request_carries_its_size_only() -> None:
    body = {"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": "x" * 400}]}
    headers = dict(scheduling_headers(InferenceRequest("r", json.dumps(body))))
    assert headers == {SIZE_HEADER: str(estimated_size(body)).encode()}
    assert int(headers[SIZE_HEADER]) > 2000


def test_a_tenant_and_priority_come_before_the_size() -> None:
    request = InferenceRequest("r", '{"model": "m"}', tenant="team-a", priority="high")
    assert [name for name, _ in scheduling_headers(request)] == ["x-tenant", "x-priority", SIZE_HEADER]


def test_a_body_that_is_no_json_object_has_no_size() -> None:
    assert scheduling_headers(InferenceRequest("r", "[1, 2]")) == ()
    assert scheduling_headers(InferenceRequest("r", "{not json")) == ()
