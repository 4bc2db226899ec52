"""A throwaway server as a context manager: started on entry, stopped on exit, and stopped too when it fails to
start (what it made so far is removed)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Throwaway(ABC):
    """``with Server(...) as server:`` -- :meth:`start` on entry, :meth:`stop` on exit or a failed start."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
