"""Secrets read from files (a mounted Kubernetes or Docker secret), checked before any client uses them."""

from __future__ import annotations

from pathlib import Path

from streamproc.errors import UserFacingError


class SecretFileError(UserFacingError):
    """A secret file that cannot be read or holds something that cannot be a secret."""


def check_secret(value: str, what: str) -> str:
    """The secret, refused (without echoing it) when empty or holding whitespace or control characters."""
    if not value:
        raise SecretFileError(f"{what} is empty")
    bad = next((i for i, char in enumerate(value) if char.isspace() or ord(char) < 32 or ord(char) == 127), None)
    if bad is not None:
        raise SecretFileError(f"{what} holds whitespace or a control character at position {bad + 1}")
    return value


def read_secret_file(path: Path, what: str) -> str:
    """A file's secret: the file's text less one trailing newline (as ``echo`` and editors leave it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"cannot read {what} from {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    return check_secret(text.removesuffix("\n").removesuffix("\r"), f"{what} in {path}")
