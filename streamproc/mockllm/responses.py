"""OpenAI response bodies and SSE frames: ``chat.completion``, ``chat.completion.chunk``, ``text_completion``.

Pure rendering of decided answers to bytes; what to answer is decided elsewhere (the engine).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from streamproc.mockllm.content import Answer
from streamproc.mockllm.jsonfast import dumps_compact
from streamproc.mockllm.validation import CHAT

SYSTEM_FINGERPRINT = "fp_mock"
DONE_FRAME = b"data: [DONE]\n\n"
STREAM_PIECES = 4  # content deltas per choice: enough to look like a stream, few enough to stay fast


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


_quote = json.encoder.encode_basestring_ascii  # the C string escaper: a JSON string literal, ASCII only


def encode(body: Any) -> bytes:
    return dumps_compact(body).encode()


def completion_json(
    endpoint: str,
    response_id: str,
    created: int,
    model: str,
    answers: Sequence[Answer],
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    """The whole (non-streamed) answer object, as JSON bytes.

    Assembled from fixed fragments rather than ``json.dumps`` of a dict: this is the hot path of the
    server and the fragments are three times cheaper. Tests check it parses to the documented shape.
    """
    if endpoint == CHAT:
        kind = "chat.completion"
        choices = ",".join(
            f'{{"index":{i},"message":{{"role":"assistant","content":{_quote(a.content)},"refusal":null}},'
            f'"logprobs":null,"finish_reason":"{a.finish_reason}"}}'
            for i, a in enumerate(answers)
        )
    else:
        kind = "text_completion"
        choices = ",".join(
            f'{{"text":{_quote(a.content)},"index":{i},"logprobs":null,"finish_reason":"{a.finish_reason}"}}'
            for i, a in enumerate(answers)
        )
    return (
        f'{{"id":{_quote(response_id)},"object":"{kind}","created":{created},"model":{_quote(model)},'
        f'"system_fingerprint":"{SYSTEM_FINGERPRINT}","choices":[{choices}],'
        f'"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":{completion_tokens},'
        f'"total_tokens":{prompt_tokens + completion_tokens}}}}}'
    ).encode()


def frame(obj: Any) -> bytes:
    return b"data: " + encode(obj) + b"\n\n"


def split_content(text: str, pieces: int = STREAM_PIECES) -> list[str]:
    """Cut a text into at most ``pieces`` consecutive parts, at spaces, that join back to it."""
    if not text:
        return []
    cuts = [0]
    for i in range(1, pieces):
        at = text.find(" ", i * len(text) // pieces)
        if at > cuts[-1]:
            cuts.append(at)
    cuts.append(len(text))
    return [text[a:b] for a, b in pairwise(cuts)]


def stream_frames(
    endpoint: str,
    response_id: str,
    created: int,
    model: str,
    answers: Sequence[Answer],
    prompt_tokens: int,
    completion_tokens: int,
    include_usage: bool,
) -> list[bytes]:
    """Every SSE frame of a streamed answer, ending with ``data: [DONE]``."""
    chat = endpoint == CHAT
    base: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }

    def chunk(index: int, text: str | None, finish: str | None, first: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", "content": ""}
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"text": text or "", "index": index, "logprobs": None, "finish_reason": finish}
        return frame({**base, "choices": [choice]})

    frames: list[bytes] = []
    for index, answer in enumerate(answers):
        if chat:
            frames.append(chunk(index, None, None, first=True))
        frames.extend(chunk(index, piece, None) for piece in split_content(answer.content))
        frames.append(chunk(index, None, answer.finish_reason))
    if include_usage:
        frames.append(frame({**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}))
    frames.append(DONE_FRAME)
    return frames
