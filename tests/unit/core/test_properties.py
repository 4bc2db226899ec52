"""Properties of the pure core over generated inputs (hypothesis): what must hold for *any* input, not only
for the cases the example tests thought of. Runs in the bare core virtualenv too (scripts/check-core)."""

from __future__ import annotations

import json
import random
import string

from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamproc.core.acker import OrderedAcker
from streamproc.core.durations import parse_duration_ms
from streamproc.core.events import InferenceRequest
from streamproc.core.headers import REQUEST_ID, Hop, Origin, read_hop
from streamproc.core.outcome import MAX_MESSAGE_CHARS, ConfigurationProblem, Failure
from streamproc.core.request_state import Conflict, RecordRef, Skip, Start, admit, on_success
from streamproc.core.retry_hints import retry_after_ms
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer, RequestStatus

# -- the acker: acks only ever cover a contiguous completed prefix -------------------------------------------


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_acks_are_a_contiguous_completed_prefix_whatever_the_completion_order(
    partitions: list[int], rng: random.Random
) -> None:
    acker: OrderedAcker[tuple[int, int]] = OrderedAcker()
    next_offset = dict.fromkeys(range(4), 0)
    tracked = []
    for partition in partitions:
        offset = next_offset[partition]
        next_offset[partition] += rng.choice((1, 1, 2, 7))  # offsets rise, with gaps (compaction, markers)
        acker.track(partition, offset, (partition, offset))
        tracked.append((partition, offset))
    order = tracked[:]
    rng.shuffle(order)
    completed: set[tuple[int, int]] = set()
    released: list[tuple[int, int]] = []
    for partition, offset in order:
        completed.add((partition, offset))
        for item in acker.complete(partition, offset):
            # everything tracked below a released offset of its partition has completed already
            assert all(done in completed for done in tracked if done[0] == item[0] and done[1] <= item[1])
            released.append(item)
    assert sorted(released) == sorted(tracked)  # in the end every event is released exactly once
    for partition in range(4):
        mine = [offset for p, offset in released if p == partition]
        assert mine == sorted(mine)  # in offset order within a partition
    assert acker.in_flight == 0 and all(acker.pending(partition) == 0 for partition in range(4))


# -- the verdict: total, bounded, and the layer rules hold for any response ----------------------------------

_header_names = st.sampled_from([
    "retry-after", "retry-after-ms", "date", "x-ratelimit-reset-requests", "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens", "content-type",
])
_header_values = st.one_of(
    st.text(max_size=30), st.integers(-5, 10**6).map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["6m0s", "1.5s", "20ms", "0", "Wed, 21 Oct 2026 07:28:00 GMT", "inf", "-1"]),
)
_headers = st.dictionaries(_header_names, _header_values, max_size=5)
_json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["error", "code", "type", "message", "detail", "details", "innererror", "error_code"]),
        children, max_size=4),
    max_leaves=12,
)
_bodies = st.one_of(st.binary(max_size=200), _json_bodies.map(lambda doc: json.dumps(doc).encode()))


@settings(max_examples=300)
@given(st.integers(100, 599), _headers, _bodies)
@example(100, {"retry-after": "100E304"}, b"")  # finite seconds, infinite milliseconds: it used to raise
def test_every_error_response_gets_a_bounded_verdict(status: int, headers: dict[str, str], body: bytes) -> None:
    verdict = classify_http_error(status, headers, body)
    assert isinstance(verdict, Failure | ConfigurationProblem)
    assert verdict.code and len(verdict.message) <= MAX_MESSAGE_CHARS
    assert verdict.http_status == status
    if isinstance(verdict, Failure):
        assert verdict.retry_after_ms is None or verdict.retry_after_ms >= 0
        if status in (500, 502, 503, 504, 529) and verdict.layer is not FailureLayer.BUSINESS:
            assert verdict.layer is FailureLayer.SERVICE  # a 5xx is the service's, unless it says the input is
    if status in (401, 403):
        assert isinstance(verdict, ConfigurationProblem) or verdict.code in (
            "rate_limit_exceeded", "overloaded", "context_length_exceeded", "request_too_large",
            "content_policy_violation")


@given(_headers, st.text(max_size=80))
def test_retry_hints_are_never_negative_and_never_raise(headers: dict[str, str], message: str) -> None:
    hint = retry_after_ms(headers, message)
    assert hint is None or hint >= 0


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_go_durations_parse_to_their_milliseconds(hours: int, minutes: int, seconds: int, millis: int) -> None:
    text = f"{hours}h{minutes}m{seconds}s" if not millis else f"{hours}h{minutes}m{seconds}.{millis:03d}s"
    assert parse_duration_ms(text) == ((hours * 60 + minutes) * 60 + seconds) * 1000 + millis


# -- headers: what one hop writes, the next hop reads back ---------------------------------------------------

_ids = st.text(string.ascii_letters + string.digits + "-_:.", min_size=1, max_size=40)


@given(_ids, st.integers(1, 50), st.text(min_size=1, max_size=30), st.integers(0, 1000), st.integers(0, 2**40),
       st.sampled_from(list(FailureLayer)), st.none() | st.integers(0, 2**42), st.none() | st.integers(0, 2**42),
       st.booleans(), st.booleans(), st.none() | st.integers(1, 2**20), st.integers(0, 2**20))
def test_hop_headers_round_trip(request_id: str, attempt: int, topic: str, partition: int, offset: int,
                                layer: FailureLayer, first_failure: int | None, due: int | None, replay: bool,
                                deferred: bool, max_tokens: int | None, run: int) -> None:
    hop = Hop(attempt, due, first_failure, Origin(topic, partition, offset), replay, deferred, max_tokens, run)
    written = hop.headers(request_id, Failure(layer, "code", "why"))
    assert read_hop(written) == hop
    assert written[REQUEST_ID] == request_id.encode()


@given(st.dictionaries(st.text(max_size=20), st.binary(max_size=20), max_size=8))
def test_any_headers_read_as_a_valid_hop(raw: dict[str, bytes]) -> None:
    hop = read_hop(raw)
    assert hop.attempt >= 1  # garbage never yields attempt 0 or a negative attempt
    assert hop.run >= 0


# -- admission: one id, any sequence of records, at most one call running -------------------------------------

_bodies_json = st.sampled_from([
    json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}),
    json.dumps({"model": "m", "messages": [{"role": "user", "content": "b"}]}),
])


@settings(max_examples=300)
@given(st.lists(st.tuples(_bodies_json, st.integers(1, 4), st.integers(0, 20), st.booleans(), st.booleans()),
                min_size=1, max_size=12))
def test_admission_is_total_and_a_success_is_final(records: list[tuple[str, int, int, bool, bool]]) -> None:
    """Feed one request id any sequence of records (bodies, attempts, offsets, replays); after each Start the
    call succeeds. Whatever the order: admission never raises, and once succeeded, nothing starts it again."""
    state = None
    for now, (body, attempt, offset, replay, deferred) in enumerate(records):
        request = InferenceRequest("r-1", body, batch_id="b")
        admission = admit(state, request, attempt, now, source=RecordRef("llm.requests", offset), replay=replay,
                          deferred=deferred)
        assert isinstance(admission, Start | Skip | Conflict)
        succeeded_before = state is not None and state.status is RequestStatus.SUCCEEDED
        if isinstance(admission, Start):
            assert not succeeded_before
            assert admission.state.status is RequestStatus.IN_FLIGHT and admission.state.attempts == attempt
            state = on_success(admission.state, now)
