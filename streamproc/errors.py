"""The base of errors that end a command with a one-line reason instead of a traceback."""

from __future__ import annotations


class UserFacingError(RuntimeError):
    """Something the user can act on (a missing tool, an unreachable broker, an invalid file)."""
