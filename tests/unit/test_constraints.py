"""constraints.txt pins every dependency streamproc declares (its own and the dev extra's, through nested extras)
at a version inside pyproject's range, so `pip install -c constraints.txt` (scripts/setup-venv, docker/Dockerfile)
installs the set the suite runs with."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def pins(text: str) -> dict[str, Version]:
    """name -> pinned version; anything but `name==version` lines is a mistake here."""
    pinned: dict[str, Version] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker, f"constraints.txt:{number}: {raw!r} is no pin"
        name = canonicalize_name(requirement.name)
        assert name not in pinned, f"constraints.txt:{number}: {name} pinned twice"
        pinned[name] = Version(specifier.version)
    return pinned


def declared(extras: tuple[str, ...] = ("dev",)) -> list[Requirement]:
    """The project's dependencies and those of `extras`, the project's own nested extras (streamproc[test]) unfolded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = canonicalize_name(project["name"])
    optional: dict[str, list[str]] = project["optional-dependencies"]
    found: list[Requirement] = []
    pending = [*project["dependencies"], *(f"{own}[{extra}]" for extra in extras)]
    seen: set[str] = set()
    while pending:
        requirement = Requirement(pending.pop())
        if canonicalize_name(requirement.name) == own:
            for extra in requirement.extras - seen:
                seen.add(extra)
                pending.extend(optional[extra])
        else:
            found.append(requirement)
    return found


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    pinned = pins((ROOT / "constraints.txt").read_text())
    requirements = declared()
    assert len(requirements) >= 20
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject's {requirement}"
    assert "streamproc" not in pinned  # the project itself is installed from the checkout


def test_the_range_check_can_fail() -> None:
    [aiohttp] = [r for r in declared() if r.name == "aiohttp"]
    assert not aiohttp.specifier.contains(Version("3.12.13"))  # below the floor pyproject sets
    assert declared(()) != declared()  # the dev extra adds its tools
    bad = pins("aiohttp==3.9.0\n")
    assert not aiohttp.specifier.contains(bad["aiohttp"])
