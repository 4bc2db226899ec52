"""Approximate token counts, with no tokenizer download and no network.

About four characters of English per token is the usual rule of thumb; the mock only needs counts that are
stable, monotone in the input and in the right range, so that context windows and TPM limits behave.
"""

from __future__ import annotations

from collections.abc import Iterable

PER_MESSAGE_OVERHEAD = 4  # role and separators, as OpenAI's counting recipe has it
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>
IMAGE_TOKENS = 85  # a low-detail image part


def text_tokens(text: str) -> int:
    """Tokens of a piece of text: ceil(chars / 4), and at least one for non-empty text."""
    return (len(text) + 3) // 4


def chat_prompt_tokens(message_texts: Iterable[str], message_count: int, image_parts: int = 0) -> int:
    """Prompt tokens of a chat request from its flattened message texts."""
    total = sum([(len(text) + 3) // 4 for text in message_texts])  # text_tokens, inlined: a hot path
    return total + PER_MESSAGE_OVERHEAD * message_count + IMAGE_TOKENS * image_parts + REPLY_PRIMING
