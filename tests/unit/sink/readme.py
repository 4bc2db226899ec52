"""The SQL examples of docs/sink.md's "The queries people ask" section, so tests run them as users will."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "sink.md"
SECTION = "## The queries people ask"
EXAMPLE_BATCH = "'labels-2026-11'"


def readme_queries(batch: str) -> list[str]:
    """Each ```sql block of the section, with the example batch id replaced by ``batch``."""
    section = PAGE.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [query.replace(EXAMPLE_BATCH, f"'{batch}'") for query in re.findall(r"```sql\n(.*?)```", section, re.S)]
