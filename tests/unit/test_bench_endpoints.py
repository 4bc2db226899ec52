"""The pure parts of ``scripts/bench endpoints`` (benchmarks/endpoints.py): the model list it gives the worker, and
its verdicts on the issue's targets."""

from __future__ import annotations

import yaml

from benchmarks.endpoints import EndpointsRun, model_list, verdicts
from streamproc.core.model_list import parse_model_list


def test_the_model_list_names_each_mock_as_a_deployment_of_one_model() -> None:
    models = parse_model_list(yaml.safe_load(model_list(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"])))
    assert [(d.key, d.model, d.api_base) for d in models.deployments] == [
        ("mock-small@1", "mock-small", "http://127.0.0.1:1/v1"), ("mock-small@2", "mock-small", "http://127.0.0.1:2/v1")]


def run(seconds: float, second: int, results: int = 100, failures: int = 0) -> EndpointsRun:
    return EndpointsRun("r", 100, results, seconds, {"mock-small@1": results - second, "mock-small@2": second},
                        failures, 0)


def test_the_targets_are_met_and_missed_where_the_issue_puts_them() -> None:
    assert [row[3] for row in verdicts(run(10, 50), run(13, 20), run(10, 40))] == ["ok"] * 4
    missed = verdicts(run(10, 50), run(13.5, 20, results=99, failures=1), run(10, 41))
    assert [row[3] for row in missed] == ["MISSED"] * 4
