"""One line of a provider batch answered by the mock's engine, as the synchronous endpoint would answer it.

The same checks, content, profile and faults apply (a line's ``[mock:KIND]`` marker forces a fault), except
what belongs to the synchronous API alone: the key (checked on the create call), rate limits and outages.
A fault that is an error status becomes that line's status and body. Transport faults spoil the delivery of
an HTTP answer, and a line has none of its own: a ``reset``, ``truncated_body``, ``non_json_body`` or
``stream_break`` line is answered intact, and a ``hang`` line gets the 500 a provider's worker that timed
out would leave.
"""

from __future__ import annotations

import json
import secrets

from streamproc.mockllm import error_bodies as errors
from streamproc.mockllm.batch_store import BatchLine, LineAnswer
from streamproc.mockllm.engine import Completed, Hang, Incoming, MockEngine
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.responses import completion_json


class LineAnswerer:
    """Answers the lines of batches for one endpoint (``chat`` or ``completions``)."""

    def __init__(self, engine: MockEngine, endpoint: str) -> None:
        self.engine = engine
        self.endpoint = endpoint

    def __call__(self, line: BatchLine) -> LineAnswer:
        request_id = f"req_{secrets.token_hex(16)}"
        outcome = self.engine.decide(Incoming(self.endpoint, line.body, request_id=line.custom_id, in_batch=True))
        if isinstance(outcome, Hang):
            reply = errors.SERVICE_FAULT_REPLIES[FaultKind.SERVER_ERROR]
            return LineAnswer(reply.status, dict(reply.body), request_id)
        if isinstance(outcome, Completed):
            body = completion_json(
                outcome.parsed.endpoint,
                outcome.response_id,
                self.engine.created(),
                outcome.parsed.model,
                outcome.answers,
                outcome.prompt_tokens,
                outcome.completion_tokens,
            )
            return LineAnswer(200, json.loads(body), request_id)
        return LineAnswer(outcome.reply.status, dict(outcome.reply.body), request_id)
