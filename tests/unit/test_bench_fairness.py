"""The pure parts of ``scripts/bench fairness`` (benchmarks/fairness.py): the requests it sends (long ones over the
pool's threshold, tenancy in the value and the headers), its bound and its counts from ``--scale``."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.fairness import add_arguments, check_arguments, completion_bound_s, request
from streamproc.core.guards.long_requests import LongRequests
from streamproc.core.tenancy import Tenancy, tenancy_headers


def test_long_requests_are_over_the_default_threshold_and_short_ones_are_not() -> None:
    pool = LongRequests(threshold_tokens=2000, share=0.25)  # the settings' defaults
    assert pool.is_long(json.loads(request("m", 1, Tenancy(), long=True).body_json))
    assert not pool.is_long(json.loads(request("m", 2, Tenancy()).body_json))


def test_a_request_carries_its_tenancy_as_submit_would() -> None:
    sent = request("b", 7, Tenancy("team-b", "high"))
    assert (sent.request_id, sent.tenant, sent.priority) == ("b-000007", "team-b", "high")
    assert dict(tenancy_headers(Tenancy(sent.tenant, sent.priority))) == {"x-tenant": b"team-b",
                                                                           "x-priority": b"high"}


def test_the_bound_is_the_issues() -> None:
    assert completion_bound_s(200, 32.0) == pytest.approx(1.5 * 200 / 16 + 5)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def test_scale_shrinks_the_issues_counts_and_explicit_counts_win() -> None:
    args = parse("--scale", "0.1")
    assert (args.flood, args.small, args.mix) == (2000, 20, 400)
    args = parse("--scale", "0.1", "--small", "200")
    assert (args.flood, args.small, args.fairness_workers) == (2000, 200, 2)


def test_unknown_figures_and_tiny_mixes_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--figures", "tenants,fast")
    with pytest.raises(SystemExit):
        parse("--mix", "5")
