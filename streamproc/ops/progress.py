"""A progress bar on a terminal, silence otherwise (logs and pipes stay clean)."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

import click


class Progress:
    """``start(total)`` once the size is known, then ``advance(n)``; drawn on stderr only if it is a TTY."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._bar: Any = None

    def start(self, total: int) -> None:
        if sys.stderr.isatty() and self._bar is None:
            self._bar = click.progressbar(length=total, label=self._label, file=sys.stderr, show_pos=True,
                                          show_eta=True)
            self._bar.__enter__()

    def advance(self, steps: int) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
