"""Which model a request is sent to: the pre-check against context windows, and the fallback lists.

Pure: the caller passes the token estimate and which models may take a call now. A request whose estimated
prompt plus ``max_tokens`` exceeds its model's window goes to the configured larger-context model, or ends
as a business failure before any call (design §5): sending it would only buy a 400. While a model's breaker
is open, its fallbacks are tried in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from streamproc.core.outcome import Failure
from streamproc.core.vocabulary import FailureLayer

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(frozen=True)
class Routes:
    """The routing configuration (from the settings): windows, context fallbacks, breaker fallbacks."""

    context_windows: Mapping[str, int] = field(default_factory=dict)
    context_fallbacks: Mapping[str, str] = field(default_factory=dict)
    model_fallbacks: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def models(self) -> set[str]:
        """Every model this configuration names."""
        return {*self.context_windows, *self.context_fallbacks, *self.context_fallbacks.values(),
                *self.model_fallbacks, *(model for listed in self.model_fallbacks.values() for model in listed)}

    def fits(self, model: str, tokens: int) -> bool:
        """True when ``tokens`` (prompt + max_tokens) fit the model's window, or its window is unknown."""
        window = self.context_windows.get(model)
        return window is None or tokens <= window

    def precheck(self, model: str, prompt_tokens: int, max_tokens: int) -> str | Failure:
        """The model to send to (the requested one, or its context fallback), or the business failure."""
        needed = prompt_tokens + max_tokens
        if self.fits(model, needed):
            return model
        larger = self.context_fallbacks.get(model)
        if larger is not None and self.fits(larger, needed):
            return larger
        window = self.context_windows[model]
        tail = (f"; its context fallback {larger!r} is too small as well" if larger is not None
                else "; no context fallback is configured for it (STREAMPROC_CONTEXT_FALLBACKS)")
        return Failure(FailureLayer.BUSINESS, CONTEXT_LENGTH_EXCEEDED,
                       f"pre-check: about {prompt_tokens} prompt tokens + max_tokens {max_tokens} = {needed} exceed "
                       f"the {window}-token context window of {model!r}{tail}; no call was made")

    def completion_room(self, model: str, prompt_tokens: int) -> int | None:
        """The largest ``max_tokens`` the pre-check lets a prompt of ``prompt_tokens`` ask of ``model`` (sent to it or
        to its context fallback); None when no window bounds it."""
        windows = [self.context_windows.get(candidate) for candidate in (model, self.context_fallbacks.get(model))
                   if candidate is not None]
        return None if None in windows else max(window for window in windows if window is not None) - prompt_tokens

    def context_fallback(self, model: str) -> str | None:
        """The larger-context model to try after the provider itself said the input was too long."""
        return self.context_fallbacks.get(model)

    def candidates(self, model: str) -> tuple[str, ...]:
        """The model, then its breaker fallbacks in order (no repeats)."""
        return tuple(dict.fromkeys([model, *self.model_fallbacks.get(model, ())]))

    def first_callable(self, model: str, may_call: Callable[[str], bool]) -> str | None:
        """The first candidate whose breaker lets a call through now, or None when every one is open."""
        return next((candidate for candidate in self.candidates(model) if may_call(candidate)), None)
