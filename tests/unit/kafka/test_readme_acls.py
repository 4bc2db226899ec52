"""The ACLs the README lists are the ones the secured broker grants and the integration tests run the job with."""

from __future__ import annotations

from pathlib import Path

from streamproc.core.acls import ADMIN, acl_plan, plan_lines
from streamproc.settings import Settings

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_lists_exactly_the_role_acls() -> None:
    section = README.read_text().split("## Connecting to a secured cluster", 1)[1].split("\n## ", 1)[0]
    listed = [line for line in section.split("```\n")[-2].splitlines() if line.startswith("User:")]
    assert listed == plan_lines([g for g in acl_plan(Settings().topology()) if g.user != ADMIN])
