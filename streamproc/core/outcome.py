"""What one LLM call came to: a success, a failure in a layer, or a setup problem (the verdict's vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from streamproc.core.vocabulary import FailureLayer

MAX_MESSAGE_CHARS: Final = 1000


@dataclass(frozen=True)
class Failure:
    """A failed attempt, in a layer: what the retry policy and the failure topics work with."""

    layer: FailureLayer
    code: str
    message: str
    http_status: int | None = None
    retry_after_ms: int | None = None


@dataclass(frozen=True)
class ConfigurationProblem:
    """An account or setup error that fails every request alike: stop consuming, never burn the batch."""

    code: str
    message: str
    http_status: int | None


@dataclass(frozen=True)
class Success:
    """A completion that passed every semantic check."""

    content: str
    model: str
    prompt_tokens: int
    completion_tokens: int


Outcome = Success | Failure | ConfigurationProblem

def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut a message to what a failure record keeps, marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
