"""Properties of the codec over generated inputs (hypothesis), issue 13 item 3.

* Decoding arbitrary bytes (random, behind a valid header, mutated valid frames, Confluent-framed) raises
  nothing but :class:`codec.CodecError`, whatever record type is expected; ``peek_request_id`` never raises.
* Every event type survives encode -> decode (both framings) with generated field values: any surrogate-free
  text, ints and longs at the Avro bounds, ``None`` wherever the schema is nullable.
* Encoding a value outside what Avro can carry (a lone surrogate, an out-of-range long) is a
  ``CodecError(UNENCODABLE)``, never another exception.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamproc import codec
from streamproc.codec import CodecError, CodecErrorCode, Event
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState

EVENT_TYPES: tuple[type[Event], ...] = (InferenceRequest, InferenceResult, FailureEvent, RequestState)
SCHEMA_IDS: dict[int, type[Event]] = dict(enumerate(EVENT_TYPES, start=1))

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # Avro int
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1  # Avro long

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- generated events ----------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=40)  # any text UTF-8 can carry (no lone surrogates)
_INTS = st.one_of(st.integers(INT_MIN, INT_MAX), st.sampled_from([INT_MIN, INT_MAX, 0, -1]))
_LONGS = st.one_of(st.integers(LONG_MIN, LONG_MAX), st.sampled_from([LONG_MIN, LONG_MAX, INT_MAX + 1, 0]))
_PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "string": _text, "int": _INTS, "long": _LONGS, "boolean": st.booleans(), "null": st.none(),
}


def _datum(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Avro data for a schema, read from the shipped .avsc, so new fields are generated without a test change:
    every string, the int and long bounds, None in every nullable union, every enum symbol."""
    if isinstance(schema, str):
        return _PRIMITIVES[schema] if schema in _PRIMITIVES else _datum(named[schema], named)
    if isinstance(schema, list):
        return st.one_of([_datum(branch, named) for branch in schema])
    kind = schema["type"]
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if "name" in schema:
        named[schema["name"]] = named[f"{schema.get('namespace', 'io.streamproc')}.{schema['name']}"] = schema
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "map":
        return st.dictionaries(_text, _datum(schema["values"], named), max_size=4)
    if kind == "array":
        return st.lists(_datum(schema["items"], named), max_size=4)
    assert kind == "record", schema
    return st.fixed_dictionaries({field["name"]: _datum(field["type"], named) for field in schema["fields"]})


def _events_of(event_type: type[Event]) -> st.SearchStrategy[Event]:
    return _datum(codec.avro_schema(event_type), {}).map(lambda datum: codec.from_avro(datum, event_type))


_events: st.SearchStrategy[Event] = st.one_of([_events_of(t) for t in EVENT_TYPES])


def _lookup(schema_id: int) -> dict[str, Any]:
    """An in-memory registry: ids 1-4 are the current schemas, anything else is unknown."""
    return codec.avro_schema(SCHEMA_IDS[schema_id])


def _request_id_of(event: Event) -> str:
    return event.request.request_id if isinstance(event, FailureEvent) else event.request_id


@FAST
@given(_events)
def test_every_event_survives_a_single_object_round_trip(event: Event) -> None:
    framed = codec.encode(event)
    assert framed[:2] == codec.SINGLE_OBJECT_MAGIC
    assert codec.decode(framed, type(event)) == event
    peeked = codec.peek_request_id(framed)
    assert peeked == (_request_id_of(event) or None)  # an empty id is "cannot be known"


@FAST
@given(_events)
def test_every_event_survives_a_confluent_round_trip(event: Event) -> None:
    schema_id = EVENT_TYPES.index(type(event)) + 1
    framed = codec.encode_confluent(event, schema_id)
    assert codec.decode(framed, type(event), schema_lookup=_lookup) == event


@FAST
@given(_events, st.sampled_from(EVENT_TYPES))
def test_a_frame_decodes_only_as_its_own_type(event: Event, expected: type[Event]) -> None:
    framed = codec.encode(event)
    if expected is type(event):
        assert codec.decode(framed, expected) == event
        return
    try:
        codec.decode(framed, expected)
    except CodecError as exc:
        assert exc.code is CodecErrorCode.WRONG_RECORD_TYPE
    else:
        raise AssertionError(f"a {type(event).__name__} decoded as a {expected.__name__}")


# -- arbitrary bytes only ever raise CodecError ---------------------------------------------------------------


def _decodes_or_codec_error(data: bytes | None, expected: type[Event], **kwargs: Any) -> Event | None:
    try:
        decoded = codec.decode(data, expected, **kwargs)
    except CodecError as exc:
        assert isinstance(exc.code, CodecErrorCode) and exc.message, repr(exc)
        return None
    assert isinstance(decoded, expected)
    return decoded


def _peek_is_text_or_none(data: bytes | None, **kwargs: Any) -> None:
    peeked = codec.peek_request_id(data, **kwargs)
    assert peeked is None or (isinstance(peeked, str) and peeked)


_fingerprints = st.sampled_from([codec.schema_fingerprint(t) for t in EVENT_TYPES])
_random_frames = st.one_of(
    st.binary(max_size=300),
    # a valid single-object header of every known schema, then anything
    st.tuples(_fingerprints, st.binary(max_size=300)).map(lambda p: codec.SINGLE_OBJECT_MAGIC + p[0] + p[1]),
    # Confluent framing with a known or unknown schema id, then anything
    st.tuples(st.integers(0, 6), st.binary(max_size=300)).map(
        lambda p: codec.CONFLUENT_MAGIC + p[0].to_bytes(4, "big") + p[1]),
    # JSON text produced by mistake (peek reads request_id / custom_id from it)
    st.recursive(st.none() | st.booleans() | st.integers() | _text,
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                     st.sampled_from(["request_id", "custom_id", "request", "x"]), inner, max_size=3),
                 max_leaves=8).map(lambda doc: json.dumps(doc).encode()),
    st.sampled_from([b"[" * 100_000, b'{"request_id": ' * 50_000, b"\xc3\x01", b"\x00", b"\x00\x00"]),
)


def _lookup_anything(schema_id: int) -> dict[str, Any]:
    if schema_id in SCHEMA_IDS:
        return _lookup(schema_id)
    raise KeyError(schema_id)  # a registry client may raise anything for an unknown id


@FAST
@given(st.none() | _random_frames, st.sampled_from(EVENT_TYPES))
def test_arbitrary_bytes_only_ever_raise_codec_errors(data: bytes | None, expected: type[Event]) -> None:
    _decodes_or_codec_error(data, expected)
    _decodes_or_codec_error(data, expected, schema_lookup=_lookup_anything)
    _peek_is_text_or_none(data)
    _peek_is_text_or_none(data, schema_lookup=_lookup_anything)


@st.composite
def _mutated_frames(draw: st.DrawFn) -> tuple[bytes, Event]:
    """A valid frame, then cut, extended, or with some of its bytes changed."""
    event = draw(_events)
    framed = bytearray(codec.encode(event))
    for _ in range(draw(st.integers(1, 4))):
        match draw(st.sampled_from(["flip", "cut", "extend", "insert"])):
            case "flip" if framed:
                index = draw(st.integers(0, len(framed) - 1))
                framed[index] = draw(st.integers(0, 255))
            case "cut":
                framed = framed[: draw(st.integers(0, len(framed)))]
            case "extend":
                framed += draw(st.binary(min_size=1, max_size=20))
            case "insert":
                index = draw(st.integers(0, len(framed)))
                framed[index:index] = draw(st.binary(min_size=1, max_size=8))
    return bytes(framed), event


@FAST
@given(_mutated_frames(), st.sampled_from(EVENT_TYPES))
def test_mutated_frames_decode_or_raise_a_codec_error(mutated: tuple[bytes, Event], expected: type[Event]) -> None:
    data, _ = mutated
    _decodes_or_codec_error(data, expected)
    _peek_is_text_or_none(data)


@FAST
@given(_events, st.integers(0, 10_000))
def test_a_body_cut_anywhere_after_the_header_is_truncated_or_still_a_record(event: Event, cut: int) -> None:
    framed = codec.encode(event)
    header = len(codec.SINGLE_OBJECT_MAGIC) + 8
    end = header + cut % (len(framed) - header + 1)
    data = framed[:end]
    if end == len(framed):
        assert codec.decode(data, type(event)) == event
        return
    try:
        codec.decode(data, type(event))
    except CodecError as exc:
        assert exc.code is CodecErrorCode.TRUNCATED, repr(exc)
    else:  # a shorter prefix can only decode if the cut fell on a record boundary, which a record has one of
        raise AssertionError(f"{end} of {len(framed)} bytes decoded")


# -- encoding: values Avro cannot carry are CodecErrors ----------------------------------------------------------

_any_text = st.text(max_size=10) | st.sampled_from(["\ud800", "a\udfffb", "\udc80"])  # lone surrogates too


@FAST
@given(_any_text, st.integers(LONG_MIN - 10, LONG_MAX + 10) | st.sampled_from([2**64, -(2**100)]))
def test_encoding_only_ever_raises_an_unencodable_codec_error(text: str, number: int) -> None:
    event = InferenceRequest(request_id=text, body_json=text, submitted_ms=number, metadata={text: text})
    try:
        framed = codec.encode(event)
    except CodecError as exc:
        assert exc.code is CodecErrorCode.UNENCODABLE, repr(exc)
        assert not (LONG_MIN <= number <= LONG_MAX) or any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        return
    assert codec.decode(framed, InferenceRequest) == event
