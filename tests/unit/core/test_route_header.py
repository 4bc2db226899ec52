"""``submit --route`` as the ``x-route`` header (core.headers, core.provider_batch_deadline.routed): read from a
submission, carried by every later hop, ignored when it names no route."""

from __future__ import annotations

import pytest

from streamproc.core import headers
from streamproc.core.outcome import Failure
from streamproc.core.provider_batch_deadline import routed
from streamproc.core.vocabulary import FailureLayer

FAILED = Failure(FailureLayer.SERVICE, "server_error", "500", 500)


@pytest.mark.parametrize("route", headers.ROUTES)
def test_a_route_is_carried_from_the_submission_to_every_later_record(route: str) -> None:
    submitted = headers.read_hop({headers.ROUTE: route.encode()})
    assert submitted.route == route
    retry = headers.read_hop(submitted.retried(10, 5, run=1).headers("r1", FAILED))
    assert (retry.attempt, retry.route) == (2, route)
    assert headers.read_hop(retry.parked(20, run=1).headers("r1", FAILED)).route == route
    assert headers.read_hop(retry.failed(5, run=1).headers("r1", FAILED)).route == route


@pytest.mark.parametrize("value", [b"provider_batch", b"", b"\xff", b"CALL", b"provider-batch "])
def test_any_other_value_is_no_route(value: bytes) -> None:
    assert headers.read_hop({headers.ROUTE: value}).route is None
    assert headers.ROUTE not in headers.read_hop({headers.ROUTE: value}).retried(1, 1, 1).headers("r", FAILED)


def test_the_record_asks_first_then_the_model_route_decides() -> None:
    assert routed("provider-batch", model_routed=False) and routed(None, model_routed=True)
    assert not routed("call", model_routed=True) and not routed(None, model_routed=False)
