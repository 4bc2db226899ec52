"""Checks of a 200 chat completion against what the request asked for (design §2, L1 and L3 rows).

Kept in the LLM layer because JSON Schema validation needs jsonschema; the core stays free of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema import exceptions as jsonschema_exceptions
from jsonschema import validators as jsonschema_validators
from referencing import Registry

from streamproc.core.outcome import Failure, Outcome, Success, truncate
from streamproc.core.verdict import classify_embedded_error, excerpt
from streamproc.core.vocabulary import FailureLayer

_T, _B = FailureLayer.TRANSPORT, FailureLayer.BUSINESS


def check_completion(body: bytes, request_body: Mapping[str, Any], *, validate_schema: bool = True) -> Outcome:
    """Check a 200 chat-completion body against what the request asked for (design §2, L1 and L3 rows).
    ``validate_schema=False`` leaves out the JSON-Schema validation, which :mod:`streamproc.llm.schema_check`
    runs off the event loop with a deadline (a ``pattern`` can backtrack for ever)."""
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        return _transport("invalid_response_body", f"200 body is not JSON ({exc}): {excerpt(body)}")
    except RecursionError:
        return _transport("invalid_response_body", f"200 body nests deeper than a parser follows: {excerpt(body)}")
    if not isinstance(doc, dict):
        return _transport("invalid_response_body", f"200 body is not a JSON object: {excerpt(body)}")
    if doc.get("error") is not None and not doc.get("choices"):
        return classify_embedded_error(doc)

    choices = doc.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        return _transport("missing_choices", f"200 body has no choices[0].message: {excerpt(body)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return _transport("invalid_response_body", f"message.content is {type(content).__name__}, not text")

    finish_reason = choice.get("finish_reason")
    refusal = message.get("refusal")
    if finish_reason == "content_filter":
        return _failure(_B, "content_policy_violation", "the provider's content filter stopped the answer")
    if isinstance(refusal, str) and refusal.strip():
        return _failure(_B, "refusal", f"the model refused: {refusal}")
    if finish_reason == "length":
        tokens = _usage(doc).get("completion_tokens")
        spent = f" after {tokens} completion tokens" if tokens is not None else ""
        return _failure(FailureLayer.SEMANTIC, "truncated", f"finish_reason=length: the answer was cut off{spent}")
    if content is None or not content.strip():
        return _failure(FailureLayer.SEMANTIC, "empty_content", "the answer has no content")

    problem = check_format(content, request_body.get("response_format"), validate_schema=validate_schema)
    if problem is not None:
        return problem
    model = doc.get("model")
    if not isinstance(model, str):
        requested = request_body.get("model")
        model = requested if isinstance(requested, str) else ""
    usage = _usage(doc)
    return Success(content, model, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))


def wants_schema(request_body: Mapping[str, Any]) -> bool:
    """The request asks for an answer valid against a JSON Schema (so its check may run long)."""
    fmt = request_body.get("response_format")
    spec = fmt.get("json_schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    return isinstance(spec, dict) and isinstance(spec.get("schema"), dict)


def check_format(content: str, response_format: Any, *, validate_schema: bool = True) -> Failure | None:
    """The answer's problem with the ``response_format`` asked for: not JSON, not an object, not valid
    against the schema (left out with ``validate_schema=False``); None when it has none."""
    fmt = response_format if isinstance(response_format, dict) else {}
    kind = fmt.get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value: Any = json.loads(content)
    except RecursionError:
        return _failure(FailureLayer.SEMANTIC, "invalid_json", "the answer nests deeper than a parser follows")
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError) and _cut_off(exc, content):
            return _failure(FailureLayer.SEMANTIC, "truncated", f"the JSON answer ends mid-value: {exc}")
        return _failure(FailureLayer.SEMANTIC, "invalid_json", f"the answer is not JSON: {exc}")
    if kind == "json_object" and not isinstance(value, dict):
        return _failure(FailureLayer.SEMANTIC, "invalid_json", f"expected a JSON object, got {type(value).__name__}")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if kind != "json_schema" or not isinstance(schema, dict) or not validate_schema:
        return None
    try:
        validator = _validator(json.dumps(schema, sort_keys=True, separators=(",", ":")))
    except jsonschema_exceptions.SchemaError as exc:
        return _failure(_B, "invalid_json_schema", f"response_format.json_schema.schema is invalid: {exc.message}")
    except Exception as exc:  # a schema jsonschema cannot even pick a validator for, e.g. "$schema": 5
        return _failure(_B, "invalid_json_schema",
                        f"response_format.json_schema.schema cannot be used: {type(exc).__name__}: {exc}")
    try:
        error = jsonschema_exceptions.best_match(validator.iter_errors(value))
    except RecursionError:
        return _failure(FailureLayer.SEMANTIC, "schema_mismatch", "the answer nests too deeply to validate")
    except Exception as exc:  # the schema cannot be applied, e.g. a $ref that resolves nowhere: the request's fault
        return _failure(_B, "invalid_json_schema",
                        f"response_format.json_schema.schema cannot be applied: {type(exc).__name__}: {exc}")
    if error is None:
        return None
    return _failure(FailureLayer.SEMANTIC, "schema_mismatch", f"{error.message} (at {error.json_path})")


def _cut_off(error: json.JSONDecodeError, content: str) -> bool:
    """The JSON ends mid-value (the input ran out, or a string never closes): cut at max_tokens."""
    return error.pos >= len(content.rstrip()) or error.msg.startswith("Unterminated string")


@lru_cache(maxsize=256)
def _validator(canonical_schema: str) -> Any:
    """Compile once per distinct schema: a batch usually shares one schema across all its requests."""
    schema = json.loads(canonical_schema)
    validator_class = jsonschema_validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema, registry=_LOCAL_REFS_ONLY)


# A "$ref" resolves within the schema (and the JSON Schema metaschemas), never over the network: jsonschema's
# default registry fetches any other URL with a blocking urlopen, no timeout, inside the worker's event loop.
_LOCAL_REFS_ONLY: Registry[Any] = Registry()


def billed_tokens(outcome: Outcome, body: bytes) -> tuple[int, int]:
    """Prompt and completion tokens the provider counts for this call: a success's, or the usage in a 200 answer
    that failed a check (a refused or cut-off answer is paid for too); (0, 0) when nothing was answered."""
    if isinstance(outcome, Success):
        return outcome.prompt_tokens, outcome.completion_tokens
    return answer_tokens(body) if outcome.http_status == 200 else (0, 0)


def answer_tokens(body: bytes) -> tuple[int, int]:
    """Prompt and completion tokens the usage of a 200 answer counts; (0, 0) when it names none."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return 0, 0
    usage = _usage(doc) if isinstance(doc, dict) else {}
    return usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)


def _usage(doc: dict[str, Any]) -> dict[str, int]:
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


def _transport(code: str, message: str) -> Failure:
    return Failure(_T, code, truncate(message), 200)


def _failure(layer: FailureLayer, code: str, message: str) -> Failure:
    return Failure(layer, code, truncate(message), 200)
