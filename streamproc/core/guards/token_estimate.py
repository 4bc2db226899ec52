"""Estimate what a call costs against a tokens/min limit, before sending it and without a tokenizer.

Providers charge a call's prompt tokens *plus its max_tokens* against TPM when it is admitted, so that is
the cost reserved. The prompt is estimated from characters (about four per token in English; tiktoken
would need to download its encodings, which the workers cannot). The error of that rule depends on the
language and the model, so the estimate is scaled by a ratio learnt from the ``usage.prompt_tokens`` that
the server reports for each answered call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4  # role and separators of a chat message
TOKENS_PER_REPLY = 3  # the primed assistant turn
TOKENS_PER_IMAGE = 85  # a low-detail image; high detail costs more, but is rarer and the ratio adapts
MIN_RATIO = 0.25
MAX_RATIO = 4.0


class TokenEstimator:
    """Prompt tokens without a tokenizer (tiktoken cannot download its encodings here): characters / 4 per
    text, +4 per message, +3 for the reply, 85 per image part; scaled by a ratio calibrated online from the
    usage.prompt_tokens the server returns."""

    def __init__(self, default_max_tokens: int = 256, alpha: float = 0.05) -> None:
        if default_max_tokens < 0:
            raise ValueError(f"default_max_tokens must be >= 0, got {default_max_tokens}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._default_max_tokens = default_max_tokens
        self._alpha = alpha
        self._ratio = 1.0

    @property
    def ratio(self) -> float:
        return self._ratio

    def raw(self, body: Mapping[str, Any]) -> int:
        """The uncalibrated estimate of a chat or completions body; odd shapes count what they can."""
        tokens = 0
        messages = body.get("messages")
        if isinstance(messages, list):
            tokens += TOKENS_PER_REPLY
            for message in messages:
                if isinstance(message, Mapping):
                    tokens += TOKENS_PER_MESSAGE + _content_tokens(message.get("content"))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            tokens += _text_tokens(prompt)
        elif isinstance(prompt, list):
            tokens += sum(_prompt_item_tokens(item) for item in prompt)
        return tokens

    def prompt_tokens(self, body: Mapping[str, Any]) -> int:
        return math.ceil(self.raw(body) * self._ratio - 1e-9)  # 100 x 1.1 is 110, not 111

    def max_tokens(self, body: Mapping[str, Any]) -> int:
        """The completion allowance: ``max_completion_tokens``, else ``max_tokens``, else the default."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return self._default_max_tokens

    def cost(self, body: Mapping[str, Any]) -> int:
        """What providers charge against TPM when the call is admitted."""
        return self.prompt_tokens(body) + self.max_tokens(body)

    def calibrate(self, raw: int, actual_prompt_tokens: int) -> None:
        """Move the ratio towards ``actual / raw`` (an EWMA, so one odd call does not swing it)."""
        if raw <= 0 or actual_prompt_tokens <= 0:
            return
        observed = actual_prompt_tokens / raw
        ratio = self._ratio + self._alpha * (observed - self._ratio)
        self._ratio = min(MAX_RATIO, max(MIN_RATIO, ratio))


def _text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return _text_tokens(content)
    if not isinstance(content, list):
        return 0
    tokens = 0
    for part in content:
        if isinstance(part, str):
            tokens += _text_tokens(part)
        elif isinstance(part, Mapping):
            kind = part.get("type")
            text = part.get("text")
            if kind in ("image_url", "image"):
                tokens += TOKENS_PER_IMAGE
            elif isinstance(text, str):
                tokens += _text_tokens(text)
    return tokens


def _prompt_item_tokens(item: Any) -> int:
    """A completions prompt item: a string, a token id, or a list of token ids."""
    if isinstance(item, str):
        return _text_tokens(item)
    if isinstance(item, int) and not isinstance(item, bool):
        return 1
    if isinstance(item, list):
        return sum(1 for token in item if isinstance(token, int) and not isinstance(token, bool))
    return 0
