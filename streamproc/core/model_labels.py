"""Model names as metric label values, bounded: every distinct label value is a series Prometheus keeps.

The configured models (named in the settings) keep their names, and so do the first :data:`FIRST_SEEN` other
models seen; every later one is ``other``. A worker flooded with random model names thus has at most
configured + :data:`FIRST_SEEN` + 1 series per metric and model.
"""

from __future__ import annotations

from collections.abc import Iterable

FIRST_SEEN = 50
OTHER = "other"


class ModelLabels:
    """The label value of each model name."""

    def __init__(self, configured: Iterable[str] = (), first_seen: int = FIRST_SEEN) -> None:
        self._configured = set(configured)
        self._seen: set[str] = set()
        self._first_seen = first_seen

    def configure(self, models: Iterable[str]) -> None:
        """Models named in the settings: always their own label."""
        self._configured.update(models)

    def label(self, model: str) -> str:
        if model in self._configured or model in self._seen:
            return model
        if len(self._seen) < self._first_seen and model != OTHER:
            self._seen.add(model)
            return model
        return OTHER
