"""No two modules of the package share a name: ``faults`` or ``run`` must say which one a reader is in,
in a traceback, an import line or a log record's logger name alike."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import streamproc

PACKAGE = Path(streamproc.__file__).parent
PACKAGE_FILES = {"__init__.py", "__main__.py"}  # every package has them: they are named by their folder


def shared_module_names(root: Path) -> dict[str, list[str]]:
    """Each module file name under ``root`` that more than one module has, with their paths."""
    paths: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name not in PACKAGE_FILES:
            paths[path.name].append(path.relative_to(root).as_posix())
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_no_two_modules_share_a_name() -> None:
    assert shared_module_names(PACKAGE) == {}


def test_a_shared_name_is_found(tmp_path: Path) -> None:
    for path in ("faults.py", "chaos/faults.py", "chaos/__init__.py", "__init__.py", "mock/plan.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    assert shared_module_names(tmp_path) == {"faults.py": ["chaos/faults.py", "faults.py"]}
