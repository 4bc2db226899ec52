"""The exit codes of every streamproc command, and the base of errors that end a command with a one-line reason
instead of a traceback."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """One table for every command (and the worker), so scripts and supervisors can tell failures apart."""

    OK = 0
    FAILED = 1
    USAGE = 2  # click's own code for a usage error
    CONFIGURATION = 3
    THRESHOLD = 4


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "the job failed or did not converge (a status command: the service is not running)",
    ExitCode.USAGE: "usage or input error: a bad flag or argument, an invalid input file, an unknown batch or group",
    ExitCode.CONFIGURATION: "configuration refused: no broker reachable, no LLM URL, the LLM endpoint refuses the "
                            "key, a tool missing",
    ExitCode.THRESHOLD: "a threshold was crossed (lag --max-lag)",
}
"""What each code means, as ``--help`` and docs/cli.md say it."""


def exit_codes_help() -> str:
    """The table for a click epilog (``\\b`` keeps click from rewrapping it)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {int(code)}  {meaning}" for code, meaning in MEANINGS.items())


class UserFacingError(RuntimeError):
    """Something the user can act on (a missing tool, an unreachable broker, an invalid file); ``exit_code`` is
    its row of :class:`ExitCode` (subclasses for input errors say so)."""

    exit_code: ExitCode = ExitCode.CONFIGURATION
