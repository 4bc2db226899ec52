"""Properties of the batch-file parser over generated lines and files (hypothesis), issue 13 item 3.

* ``parse_line``: any line (random text, random JSON, OpenAI batch and simple-form lines with random fields,
  ``stream: true`` bodies, huge lines) is blank (``None``), a request, or a :class:`LineError` naming the
  line number and a reason; nothing else, and it never raises. A request is what can be sent: a non-blank id
  UTF-8 can carry, a supported url, and a body that is a JSON object (strict JSON: no NaN or Infinity, not
  even from a number a float cannot hold) with a model and a non-empty list of messages, not streamed, within
  the size limit.
* ``validate_file`` / ``iter_requests``: over a whole file (blank lines, CRLF, a BOM, invalid UTF-8, lines
  over the cap, duplicate ids), parsed + rejected = the non-blank lines; each rejection names its line and
  reason, a duplicate names the line that owns the id, no id is sent twice, and ``iter_requests`` yields
  exactly the valid requests (or raises only ``BatchFileError`` when told not to skip).
"""

from __future__ import annotations

import codecs
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamproc.core.endpoints import ENDPOINTS
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import custom_id_of
from streamproc.ops.input_file import BatchFileError, iter_requests, validate_file
from streamproc.ops.input_lines import BatchLimits, LineError, parse_line

LIMITS = BatchLimits(max_body_bytes=2_000)  # small, so that generated lines reach the body and line caps
BATCH, SUBMITTED = "batch-p", 1_700_000_000_000
JSON_WHITESPACE = " \t\r\n"

LINES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- generated lines ----------------------------------------------------------------------------------------

_text = st.text(max_size=20)  # surrogates included: json.dumps escapes them, the parser must refuse them
_ids = st.one_of(st.sampled_from(["a", "b", "req-1", " a ", "ü/7"]),
                 st.text(st.characters(codec="utf-8"), min_size=1, max_size=10).filter(str.strip))
_bad_ids = st.one_of(st.sampled_from(["", "   ", "\ud800", "a\udc80"]), _text)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _text)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)
_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _text}),
                     min_size=1, max_size=3)
ABSENT: Any = ...


def _mostly(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """A field that is usually well-formed, so that valid lines are common, and otherwise anything."""
    return draw(good) if draw(st.integers(0, 9)) < 8 else draw(st.one_of(bad, st.just(ABSENT)))


def _present(mapping: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in mapping.items() if value is not ABSENT}


@st.composite
def _batch_lines(draw: st.DrawFn) -> dict[str, Any]:
    body = _present({
        "model": _mostly(draw, st.just("gpt-x"), _json),
        "messages": _mostly(draw, _messages, _json),
        "stream": _mostly(draw, st.sampled_from([ABSENT, False, None]), st.one_of(st.just(True), _json)),
        **draw(st.dictionaries(st.sampled_from(["temperature", "max_tokens", "response_format", "x_extra"]), _json,
                               max_size=2)),
    })
    extra = _mostly(draw, st.just({}), st.dictionaries(st.sampled_from(["id", "prompt", "custom-id", "extra"]), _json,
                                                        min_size=1, max_size=1))
    return _present({
        "custom_id": _mostly(draw, _ids, st.one_of(_bad_ids, _json)),
        "method": _mostly(draw, st.just("POST"), _json),
        "url": _mostly(draw, st.just("/v1/chat/completions"), st.one_of(st.just("/v1/completions"), _json)),
        "body": _mostly(draw, st.just(body), _json),
        **({} if extra is ABSENT else extra),
    })


@st.composite
def _simple_lines(draw: st.DrawFn) -> dict[str, Any]:
    return _present({
        "id": _mostly(draw, _ids, st.one_of(_bad_ids, _json)),
        "prompt": _mostly(draw, st.sampled_from(["Label this", "Grüße 👋"]), st.one_of(_text, _json)),
        "model": _mostly(draw, st.sampled_from([ABSENT, None, "m"]), _json),
        "system": _mostly(draw, st.one_of(st.just(ABSENT), st.none(), _text), _json),
        "response_format": _mostly(draw, st.sampled_from([ABSENT, None, {"type": "json_object"}]), _json),
        "max_tokens": _mostly(draw, st.one_of(st.just(ABSENT), st.none(), st.integers(1, 2**70)),
                              st.one_of(st.integers(-2, 0), _json)),
    })


_OVERFLOW_LINE = ('{"custom_id": "inf", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", '
                  '"messages": [{"role": "user", "content": "hi"}], "temperature": NUMBER}}')


def _huge_line(size: int) -> str:
    """A valid simple-form line whose prompt makes it about ``size`` characters long."""
    return json.dumps({"id": f"huge-{size}", "prompt": "x" * max(1, size - 30)})


_lines = st.one_of(
    _batch_lines().map(json.dumps),
    _simple_lines().map(json.dumps),
    _json.map(json.dumps),
    st.text(max_size=60),
    st.sampled_from(["", " ", "\t\r", "{}", "[]", "null", '{"id": "a", "prompt": NaN}', '{"id": "a", "prompt": 1e400}',
                     '{"id": "n", "prompt": "p", "max_tokens": ' + "9" * 5000 + "}", "[" * 5000 + "]" * 5000]),
    st.sampled_from([LIMITS.max_body_bytes - 200, LIMITS.max_body_bytes + 10, 3 * LIMITS.max_body_bytes]).map(
        _huge_line),
    st.sampled_from(["1e400", "-1e400", "1E999", "1e308"]).map(lambda number: _OVERFLOW_LINE.replace("NUMBER", number)),
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number} overflows to {value}")
    return value


def _strict_json(text: str) -> Any:
    """json.loads that refuses what is not JSON (httpx refuses to send it): NaN, Infinity, and numbers that
    only a float overflow reads."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite)


def _custom_id(request: InferenceRequest) -> str:
    """The line's own id: the request id without its batch scope (core.identity)."""
    return custom_id_of(request.request_id, request.batch_id)


def _check_request(request: InferenceRequest, limits: BatchLimits) -> None:
    """What a parsed line must be, to be sent."""
    assert request.request_id.strip() and request.request_id.encode("utf-8")
    assert request.url in ENDPOINTS
    assert (request.batch_id, request.submitted_ms, request.repair) == (BATCH, SUBMITTED, None)
    assert len(request.body_json.encode("utf-8")) <= limits.max_body_bytes
    body = _strict_json(request.body_json)
    assert isinstance(body, dict)
    assert isinstance(body.get("model"), str) and body["model"].strip()
    messages = body.get("messages")
    assert isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
    assert body.get("stream") in (None, False)


@LINES
@given(_lines, st.integers(1, 10**9))
def test_any_line_is_blank_a_request_or_an_error_naming_its_line(text: str, line: int) -> None:
    outcome = parse_line(text, line, LIMITS, BATCH, SUBMITTED)
    if not text.strip(JSON_WHITESPACE):
        assert outcome is None
        return
    assert isinstance(outcome, InferenceRequest | LineError), outcome
    if isinstance(outcome, LineError):
        assert outcome.line == line and outcome.reason
        assert str(outcome).startswith(f"line {line}")
        assert outcome.custom_id is None or (outcome.custom_id.strip() and outcome.custom_id.encode("utf-8"))
    else:
        _check_request(outcome, LIMITS)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["1e400", "-1e400", "1E999", "2e308", "-" + "9" * 400 + ".0"]))
def test_a_number_over_a_float_is_refused_not_sent_as_infinity(number: str) -> None:
    outcome = parse_line(_OVERFLOW_LINE.replace("NUMBER", number), 3, LIMITS, BATCH, SUBMITTED)
    assert isinstance(outcome, LineError) and outcome.line == 3, outcome


# -- whole files ----------------------------------------------------------------------------------------------

_raw_lines = st.one_of(
    _lines.map(lambda text: text.encode("utf-8", "surrogatepass")),  # a lone surrogate is invalid UTF-8 too
    st.one_of(_batch_lines(), _simple_lines()).map(lambda line: json.dumps(line).encode("utf-8", "surrogatepass")),
    st.sampled_from(["a", "b", "req-1", "dup"]).map(
        lambda custom_id: json.dumps({"id": custom_id, "prompt": "same id again"}).encode()),  # duplicates
    st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b"")),
    st.sampled_from([b"", b"\r", b" \t", b"\xef\xbb\xbf", b"\xff\xfe"]),
    st.integers(1, 3).map(lambda n: b" " * (LIMITS.max_line_bytes + n)),  # blank, but over the cap: not read
)


@st.composite
def _files(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_raw_lines, max_size=25))
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = b"".join(line + newline for line in lines)
    if draw(st.booleans()):
        data = data.removesuffix(newline)  # no newline after the last line
    if draw(st.booleans()):
        data = codecs.BOM_UTF8 + data
    return data


def _expected_outcomes(data: bytes, limits: BatchLimits) -> list[tuple[int, str, str | None]]:
    """(line, "valid" | "error", id) for every non-blank line, computed line by line with parse_line, which
    the property above covers: what the file reader adds is reading, numbering, the caps and duplicates."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # the newline ends the last line; it does not start another
    owners: set[str] = set()
    outcomes: list[tuple[int, str, str | None]] = []
    for number, raw in enumerate(pieces, start=1):
        if len(raw) > limits.max_line_bytes:  # counted with its \r (and BOM) before anything is stripped
            outcomes.append((number, "error", None))
            continue
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            text = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            outcomes.append((number, "error", None))
            continue
        parsed = parse_line(text, number, limits, BATCH, SUBMITTED)
        if parsed is None:
            continue
        custom_id = _custom_id(parsed) if isinstance(parsed, InferenceRequest) else parsed.custom_id
        duplicate = custom_id is not None and custom_id in owners
        if custom_id is not None:
            owners.add(custom_id)
        valid = isinstance(parsed, InferenceRequest) and not duplicate
        outcomes.append((number, "valid" if valid else "error", custom_id))
    return outcomes


@FILES
@given(_files())
@example(b'{"id": "a", "prompt": "x"}\n\n{"id": "a", "prompt": "y"}\r\n' + b" " * (LIMITS.max_line_bytes + 1))
def test_every_non_blank_line_of_a_file_is_parsed_or_rejected_once(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="input-lines-") as tmp:
        path = Path(tmp) / "requests.jsonl"
        path.write_bytes(data)
        expected = _expected_outcomes(data, LIMITS)
        report = validate_file(path, LIMITS, BATCH, max_errors=10_000, tmp_dir=Path(tmp))
        sent = list(iter_requests(path, LIMITS, BATCH, SUBMITTED, skip_invalid=True, tmp_dir=Path(tmp)))
        try:
            strict = list(iter_requests(path, LIMITS, BATCH, SUBMITTED, skip_invalid=False, tmp_dir=Path(tmp)))
        except BatchFileError as exc:
            assert report.error_count and exc.error == report.errors[0]
        else:
            assert report.error_count == 0 and strict == sent

    errors = [(number, custom_id) for number, kind, custom_id in expected if kind == "error"]
    assert report.valid + report.error_count == len(expected)  # parsed + rejected = the non-blank lines
    assert [(error.line, error.custom_id) for error in report.errors] == errors
    assert report.lines == len(data.split(b"\n")) - (data.endswith(b"\n") or not data)
    for error in report.errors:
        assert error.reason
        if error.reason.startswith("duplicate custom_id"):
            first = next(number for number, _, custom_id in expected if custom_id == error.custom_id)
            assert error.reason.endswith(f"(first on line {first})")
    assert len(sent) == report.valid
    assert len({request.request_id for request in sent}) == len(sent)  # no id is sent twice
    for request in sent:
        _check_request(request, LIMITS)
