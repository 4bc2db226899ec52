"""Lines of OpenAI's batch output and error files (``BatchRequestOutput``: ``id``, ``custom_id``, ``response``,
``error``), as OpenAI writes them.

``response`` is what the provider answered: its status, its request id (the ``x-request-id`` header; null
when it sent none, never made up) and its body as received. ``error`` is set only when the failure is not the
provider's HTTP status itself:

* an HTTP failure (4xx, 5xx): ``response`` with the provider's status and body verbatim, ``error: null``;
* no HTTP answer (timeout, connection error), no call (cancelled, expired, refused before calling): ``error``
  with our code and message, ``response: null``, as OpenAI writes ``batch_expired`` and ``batch_cancelled``;
* a 200 answer our checks rejected (refusal, ``finish_reason=length``, schema mismatch): ``response`` keeps the
  answer that was paid for, ``error`` says why it is not a result.

Our diagnosis goes under ``"streamproc"``. Two cases cannot be verbatim: an error body that is not a JSON
object (an HTML page, an empty 400, a body cut at the bound, or a failure written before bodies were kept) is
rebuilt in OpenAI's error shape around the provider's text (``streamproc.body_rebuilt``), and a 200 that is
not a JSON object has no ``response``; its text is in ``streamproc.response_text``.
"""

from __future__ import annotations

import json
from typing import Any

from streamproc.core.events import InferenceResult
from streamproc.ops.output_format import HeldFailure, line_id, result_custom_id, result_marks


def output_line(result: InferenceResult) -> dict[str, Any]:
    """One line of the output file, under the user's custom_id (the request id without its batch scope)."""
    custom_id = result_custom_id(result)
    body: Any
    try:
        body = json.loads(result.response_json)
    except ValueError:  # kept as received: the export must not fail on one odd record
        body = result.response_json
    line: dict[str, Any] = {
        "id": line_id(result.batch_id, custom_id),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": result.provider_request_id, "body": body},
        "error": None,
    }
    marks = result_marks(result)
    if marks:
        line["streamproc"] = marks
    return line


def error_line(custom_id: str, failure: HeldFailure) -> dict[str, Any]:
    """One line of the error file for a request whose outcome is ``failure`` (see the module's rules)."""
    ours = failure.ours()
    line: dict[str, Any] = {"id": line_id(failure.batch_id, custom_id), "custom_id": custom_id, "response": None,
                            "error": None, "streamproc": ours}
    status = failure.http_status
    body = failure.body_object()
    verdict = {"code": failure.error_code, "message": failure.message}
    if status is not None and not 200 <= status < 300:
        if body is None:
            body = _rebuilt_body(failure, status)
            ours["body_rebuilt"] = True
        line["response"] = _response(status, failure, body)
    elif status is not None and body is not None:
        line["response"] = _response(status, failure, body)
        line["error"] = verdict
    else:
        line["error"] = verdict
        if failure.response_body:
            ours["response_text"] = failure.response_body
    return line


def _response(status: int, failure: HeldFailure, body: dict[str, Any]) -> dict[str, Any]:
    return {"status_code": status, "request_id": failure.provider_request_id, "body": body}


def _rebuilt_body(failure: HeldFailure, status: int) -> dict[str, Any]:
    """OpenAI's error shape around the provider's own text (or, when it sent none, our message)."""
    text = (failure.response_body or "").strip()
    return {"error": {"message": text or failure.message, "type": _error_type(status), "param": None,
                      "code": failure.error_code}}


def _error_type(status: int) -> str:
    """OpenAI's ``error.type`` family for a status (its 429s say ``requests``/``tokens``: too specific to guess)."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"
