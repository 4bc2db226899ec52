"""What ``status`` shows of the deployments out of rotation at the live workers (design §5.10)."""

from __future__ import annotations

from streamproc.core.batch_status import StatusFold
from streamproc.core.deployments_out import DeploymentOut
from streamproc.ops.status import StatusReport

OUT = DeploymentOut("mock-small@2", "circuit breaker open after calls that hang (read_timeout)", 2)


def test_status_names_each_deployment_out_and_why() -> None:
    report = StatusReport(StatusFold("b1").status(3), out=(OUT,))
    assert ("out        mock-small@2: circuit breaker open after calls that hang (read_timeout) (2 workers)"
            in report.format().splitlines())
    assert report.as_json()["deployments_out"] == [{"deployment": "mock-small@2", "reason": OUT.reason,
                                                    "workers": 2}]


def test_with_every_deployment_in_rotation_status_says_nothing_of_them() -> None:
    report = StatusReport(StatusFold("b1").status(3))
    assert "out " not in report.format() and report.as_json()["deployments_out"] == []
