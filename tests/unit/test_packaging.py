"""``pip install .`` builds streamproc without a warning about its own metadata (the build backend's deprecations
reach every user's first install) and ships the licence as current packaging metadata says (PEP 639)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_builds_without_warnings_and_declares_its_license(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "streamproc", source / "streamproc", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
                            str(source), "-w", str(tmp_path / "dist")],
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    log = built.stdout + built.stderr
    warnings = [line for line in log.splitlines() if "Warning" in line or "deprecated" in line.lower()]
    assert not warnings, "\n".join(warnings)

    [wheel] = (tmp_path / "dist").glob("streamproc-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in archive.namelist())
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
