"""The engine's decisions without HTTP: order of checks, real business checks, attempts, stats."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from streamproc.mockllm.engine import Completed, Hang, Incoming, MockEngine, Outcome, Rejected
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.profiles import BUILTIN_PROFILES, OutageWindow, Overrides, Profile, ServerLimits, customize
from streamproc.mockllm.validation import CHAT, COMPLETIONS


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "mock-small", "messages": [{"role": "user", "content": content}], **extra}


def engine(profile: Profile | None = None, **kwargs: Any) -> MockEngine:
    return MockEngine(profile or BUILTIN_PROFILES["clean"], 0, **kwargs)


def send(e: MockEngine, body: Any, endpoint: str = CHAT, **headers: Any) -> Outcome:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return e.decide(Incoming(endpoint, raw, **headers))


def error_of(outcome: Outcome) -> tuple[int, str | None]:
    """Status and structured code of an error answer (which also names its attempt in a header)."""
    assert isinstance(outcome, Rejected), outcome
    return outcome.reply.status, outcome.reply.code


def test_clean_answer() -> None:
    outcome = send(engine(), chat())
    assert isinstance(outcome, Completed)
    assert outcome.transport is None and outcome.latency == 0
    assert outcome.answers[0].finish_reason == "stop"
    assert outcome.response_id.endswith("x0")
    assert outcome.headers == {}


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", None, None),
        (b"\xff\xfe", None, None),
        (b"[" * 100_000, None, None),
        ([1, 2], "invalid_type", "body"),
        ({"messages": []}, "missing_required_parameter", "model"),
        ({"model": 5, "messages": []}, "invalid_type", "model"),
        ({"model": "mock-small"}, "missing_required_parameter", "messages"),
        ({"model": "mock-small", "messages": "hi"}, "invalid_type", "messages"),
        ({"model": "mock-small", "messages": []}, "invalid_value", "messages"),
        ({"model": "mock-small", "messages": ["hi"]}, "invalid_type", "messages[0]"),
        ({"model": "mock-small", "messages": [{"content": "x"}]}, "missing_required_parameter", "messages[0].role"),
        ({"model": "mock-small", "messages": [{"role": "robot", "content": "x"}]}, "invalid_value", None),
        ({"model": "mock-small", "messages": [{"role": ["user"], "content": "x"}]}, "invalid_value", None),
        ({"model": "mock-small", "messages": [{"role": "user"}]}, "missing_required_parameter", None),
        ({"model": "mock-small", "messages": [{"role": "user", "content": 3}]}, "invalid_type", None),
        ({"model": "mock-small", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "invalid_type", None),
        (chat(max_tokens="10"), "invalid_type", "max_tokens"),
        (chat(max_tokens=0), "invalid_value", "max_tokens"),
        (chat(max_tokens=True), "invalid_type", "max_tokens"),
        (chat(n=0), "invalid_value", "n"),
        (chat(temperature=3), "invalid_value", "temperature"),
        (chat(temperature="hot"), "invalid_type", "temperature"),
        (chat(stream="yes"), "invalid_type", "stream"),
        (chat(stream_options={"include_usage": True}), "invalid_value", "stream_options"),
        (chat(stop=[1]), "invalid_type", "stop"),
        (chat(response_format="json"), "invalid_type", "response_format"),
        (chat(response_format={"type": "xml"}), "invalid_value", "response_format.type"),
        (chat(response_format={"type": "json_schema"}), "missing_required_parameter", None),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
            "missing_required_parameter",
            None,
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": []}}),
            "invalid_type",
            None,
        ),
    ],
)
def test_malformed_requests_get_openai_400s(body: Any, code: str | None, param: str | None) -> None:
    outcome = send(engine(), body)
    assert isinstance(outcome, Rejected)
    assert outcome.reply.status == 400
    error = outcome.reply.body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"model": "mock-small"}, "missing_required_parameter"),
        ({"model": "mock-small", "prompt": 5}, "invalid_type"),
        ({"model": "mock-small", "prompt": []}, "invalid_value"),
        ({"model": "mock-small", "prompt": [1, "a"]}, "invalid_type"),
    ],
)
def test_malformed_completions(body: Any, code: str) -> None:
    assert error_of(send(engine(), body, COMPLETIONS)) == (400, code)


def test_completions_prompts() -> None:
    outcome = send(engine(), {"model": "mock-small", "prompt": ["one", "two"], "n": 2}, COMPLETIONS)
    assert isinstance(outcome, Completed)
    assert len(outcome.answers) == 4
    outcome = send(engine(), {"model": "mock-small", "prompt": [[1, 2, 3], [4]]}, COMPLETIONS)
    assert isinstance(outcome, Completed)
    assert outcome.prompt_tokens == 4


def test_unknown_model_is_404() -> None:
    assert error_of(send(engine(), {**chat(), "model": "gpt-17"})) == (404, "model_not_found")


def test_context_window_is_a_real_check() -> None:
    e = engine()
    # 4096 window, 256 reserved by default: 3 reply + 4 per message + ceil(len / 4)
    fits = "x" * ((4096 - 256 - 7) * 4)
    assert isinstance(send(e, chat(fits)), Completed)
    assert error_of(send(e, chat(fits + "xxxx"))) == (400, "context_length_exceeded")
    assert isinstance(send(e, chat(fits + "xxxx", max_tokens=255)), Completed)
    assert isinstance(send(e, {**chat(fits * 2), "model": "mock-large"}), Completed)
    outcome = send(e, chat("hi", max_tokens=5000))
    assert error_of(outcome) == (400, "context_length_exceeded")
    assert isinstance(outcome, Rejected)
    assert "maximum context length is 4096 tokens" in outcome.reply.body["error"]["message"]
    assert "(8 in the messages, 5000 in the completion)" in outcome.reply.body["error"]["message"]


def test_api_key() -> None:
    e = engine(api_key="sk-right-key")
    assert error_of(send(e, chat())) == (401, None)
    assert error_of(send(e, chat(), authorization="Bearer sk-wrong-key-1234")) == (401, "invalid_api_key")
    assert isinstance(send(e, chat(), authorization="Bearer sk-right-key"), Completed)
    assert e.stats.by_outcome == {"unauthorized": 2, "ok": 1}


def test_attempts_count_same_content_whatever_the_key_order() -> None:
    e = engine()
    first = send(e, b'{"model": "mock-small", "messages": [{"role": "user", "content": "hi"}]}')
    again = send(e, b'{"messages":[{"content":"hi","role":"user"}],"model":"mock-small"}')
    assert isinstance(first, Completed) and isinstance(again, Completed)
    assert (first.response_id[-2:], again.response_id[-2:]) == ("x0", "x1")
    assert first.answers == again.answers
    assert e.stats.requests.summary()["calls_histogram"] == {"2": 1}


def test_forced_faults_by_header_and_marker() -> None:
    e = engine()
    assert error_of(send(e, chat("a"), forced_fault="server_error")) == (500, None)
    assert isinstance(send(e, chat("b"), forced_fault="hang"), Hang)
    reset = send(e, chat("c"), forced_fault="reset")
    assert isinstance(reset, Completed) and reset.transport is FaultKind.RESET
    semantic = send(e, chat("d"), forced_fault="empty_content")
    assert isinstance(semantic, Completed) and semantic.transport is None and semantic.answers[0].content == ""
    assert error_of(send(e, chat("e"), forced_fault="bogus")) == (400, "invalid_value")
    # the marker fails the first two attempts, then the same request succeeds
    marked = chat("Summarise [mock:service_unavailable*2] this")
    assert [getattr(send(e, marked), "reply", None) is not None for _ in range(3)] == [True, True, False]
    # a header wins over a marker
    assert isinstance(send(e, chat("[mock:server_error]"), forced_fault="none"), Completed)


def test_business_faults_repeat_and_are_counted_when_called_again() -> None:
    e = engine(customize(BUILTIN_PROFILES["clean"], Overrides(faults={FaultKind.CONTENT_POLICY: 1.0})))
    for _ in range(3):
        assert error_of(send(e, chat(), request_id="r-1")) == (400, "content_policy_violation")
    summary = e.stats.requests.summary()
    assert summary["repeated_after_business_failure"] == 2
    assert e.stats.request_ids.summary()["repeated_after_business_failure"] == 2
    assert e.stats.request_ids.detail() == {"r-1": {"calls": 3, "outcomes": ["content_policy"] * 3}}


def test_a_forced_huge_answer_is_a_clean_200_of_the_profiles_size_on_every_attempt() -> None:
    e = engine(replace(BUILTIN_PROFILES["clean"], huge_answer_bytes=1_500_000))
    for _ in range(2):  # a business fault: asking again answers as long
        outcome = send(e, chat("Write it all out [mock:huge_answer]"))
        assert isinstance(outcome, Completed) and outcome.transport is None
        assert len(outcome.answers[0].content.encode()) == 1_500_000
        assert outcome.completion_tokens == 375_000
    assert e.stats.by_layer == {"business": 2}


def test_context_length_counts_as_a_business_failure() -> None:
    e = engine()
    send(e, chat("hi", max_tokens=9999))
    send(e, chat("hi", max_tokens=9999))
    assert e.stats.requests.summary()["repeated_after_business_failure"] == 1
    assert e.stats.by_layer == {"business": 2}


def test_injected_429_carries_the_retry_hint() -> None:
    profile = replace(BUILTIN_PROFILES["clean"], retry_after_seconds=1.5)
    outcome = send(engine(profile), chat(), forced_fault="rate_limit")
    assert error_of(outcome) == (429, "rate_limit_exceeded")
    assert isinstance(outcome, Rejected)
    assert outcome.headers["retry-after-ms"] == "1500"
    assert outcome.headers["retry-after"] == "2"
    assert "Please try again in 1.5s." in outcome.reply.body["error"]["message"]
    assert outcome.reply.body["error"]["type"] == "requests"


def test_rate_limits_over_all_clients() -> None:
    clock = FakeClock()
    profile = replace(BUILTIN_PROFILES["clean"], rate_limits=ServerLimits(rpm=60, burst_seconds=2.0))
    e = engine(profile, clock=clock)
    assert isinstance(send(e, chat("a")), Completed)
    assert isinstance(send(e, chat("b")), Completed)
    refused = send(e, chat("c"))
    assert error_of(refused) == (429, "rate_limit_exceeded")
    assert isinstance(refused, Rejected)
    assert refused.headers["retry-after-ms"] == "1000"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert "Please try again in 1s." in refused.reply.body["error"]["message"]
    clock.now += 1.0
    assert isinstance(send(e, chat("c")), Completed)
    assert e.stats.by_outcome == {"ok": 3, "rate_limited": 1}


def test_tokens_per_minute() -> None:
    clock = FakeClock()
    profile = replace(BUILTIN_PROFILES["clean"], rate_limits=ServerLimits(tpm=6000, burst_seconds=1.0))
    e = engine(profile, clock=clock)  # 100 tokens per second, bucket of 100
    assert isinstance(send(e, chat("a", max_tokens=50)), Completed)  # 8 prompt + 50
    refused = send(e, chat("b", max_tokens=50))
    assert error_of(refused) == (429, "rate_limit_exceeded")
    assert isinstance(refused, Rejected)
    assert refused.reply.body["error"]["type"] == "tokens"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "42"


def test_outage_window_and_switch() -> None:
    clock = FakeClock()
    profile = replace(BUILTIN_PROFILES["clean"], outage=OutageWindow(seconds=10.0, start=5.0))
    e = engine(profile, clock=clock)
    assert isinstance(send(e, chat()), Completed)
    clock.now += 6
    outage = send(e, chat())
    assert error_of(outage) == (503, None)
    assert isinstance(outage, Rejected) and outage.headers["retry-after"] == "9"
    clock.now += 10
    assert isinstance(send(e, chat()), Completed)
    e.outage.switch_on(clock.now)
    assert error_of(send(e, chat())) == (503, None)
    e.outage.switch_off()
    assert isinstance(send(e, chat()), Completed)


def test_seeded_latency_is_reproducible() -> None:
    profile = customize(BUILTIN_PROFILES["realistic"], Overrides(faults=dict.fromkeys(FaultKind, 0.0)))
    latencies = [
        o.latency for o in (send(engine(profile), chat(str(i))) for i in range(50)) if isinstance(o, Completed)
    ]
    again = [o.latency for o in (send(engine(profile), chat(str(i))) for i in range(50)) if isinstance(o, Completed)]
    assert len(latencies) == 50 and latencies == again
    assert len(set(latencies)) == 50
    assert 0.1 < sorted(latencies)[25] < 1.0


def test_reset_forgets_attempts() -> None:
    e = engine()
    send(e, chat())
    send(e, chat())
    e.reset()
    outcome = send(e, chat())
    assert isinstance(outcome, Completed) and outcome.response_id.endswith("x0")
    assert e.snapshot()["calls"] == 1


# ---- the strict profile's quirks ---------------------------------------------------------------------


def strict(**changes: Any) -> Profile:
    """The strict profile without random faults, so each test sees only the quirk it is about."""
    return replace(BUILTIN_PROFILES["strict"], faults={}, **changes)


def test_on_429_servers_send_rate_limit_headers_only_when_refusing() -> None:
    clock = FakeClock()
    e = engine(strict(rate_limits=ServerLimits(rpm=60, burst_seconds=1.0)), clock=clock)
    admitted = send(e, chat("a"))
    assert isinstance(admitted, Completed) and admitted.headers == {}
    refused = send(e, chat("b"))
    assert error_of(refused) == (429, "rate_limit_exceeded")
    assert isinstance(refused, Rejected)
    assert refused.headers["x-ratelimit-limit-requests"] == "60"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["retry-after-ms"] == "1000"
    clock.now += 1.0
    failed = send(e, chat("c"), forced_fault="server_error")
    assert error_of(failed) == (500, None)
    assert isinstance(failed, Rejected) and not any(h.startswith("x-ratelimit") for h in failed.headers)
    clock.now += 1.0
    injected = send(e, chat("d"), forced_fault="rate_limit")
    assert error_of(injected) == (429, "rate_limit_exceeded")
    assert isinstance(injected, Rejected) and not any(h.startswith("x-ratelimit") for h in injected.headers)


def test_strict_injected_429s_name_no_bucket_and_carry_only_retry_after() -> None:
    """A 429 for the server's own reasons: a client cannot tell it from congestion by a bucket header."""
    clock = FakeClock()
    e = engine(strict(rate_limits=ServerLimits(rpm=60, burst_seconds=1.0)), clock=clock)
    injected = send(e, chat("a"), forced_fault="rate_limit")
    assert error_of(injected) == (429, "rate_limit_exceeded")
    assert isinstance(injected, Rejected)
    assert {k: v for k, v in injected.headers.items() if not k.startswith("x-mock-")} == {"retry-after": "1"}


def test_strict_v1_injected_429s_carry_the_limiters_headers_with_room_left() -> None:
    clock = FakeClock()
    e = engine(replace(BUILTIN_PROFILES["strict-v1"], faults={}, rate_limits=ServerLimits(rpm=600, burst_seconds=1.0)),
               clock=clock)
    injected = send(e, chat("a"), forced_fault="rate_limit")
    assert isinstance(injected, Rejected) and injected.headers["x-ratelimit-limit-requests"] == "600"
    assert injected.headers["x-ratelimit-remaining-requests"] == "9"  # of 10: its own request was admitted
    assert injected.headers["retry-after"] == "1"


def test_strict_admits_one_second_of_its_rate_at_once() -> None:
    clock = FakeClock()
    e = engine(strict(), clock=clock)
    outcomes = [send(e, chat(str(i))) for i in range(60)]
    assert sum(isinstance(o, Completed) for o in outcomes) == 50  # 3,000 RPM = 50 per second
    assert all(error_of(o) == (429, "rate_limit_exceeded") for o in outcomes[50:])


def test_strict_hangs_last_90_seconds_and_strict_v1_hangs_have_no_end() -> None:
    outcome = send(engine(strict()), chat(), forced_fault="hang")
    assert isinstance(outcome, Hang) and outcome.seconds == 90.0
    outcome = send(engine(replace(BUILTIN_PROFILES["strict-v1"], faults={})), chat(), forced_fault="hang")
    assert isinstance(outcome, Hang) and outcome.seconds == math.inf


def test_strict_unlimited_admits_everything_the_limiter_would_have_refused() -> None:
    e = engine(replace(BUILTIN_PROFILES["strict-unlimited"], faults={}), clock=FakeClock())
    assert all(isinstance(send(e, chat(str(i))), Completed) for i in range(200))


@pytest.mark.parametrize(
    ("request_id", "admitted"),
    [
        (None, True),
        ("", True),
        ("1b4e28ba-2fa1-11d2-883f-0016d3cca427", True),
        ("1B4E28BA2FA111D2883F0016D3CCA427", True),  # any spelling uuid.UUID reads
        ("batch-1:row-7", False),
        ("1b4e28ba-2fa1-11d2-883f", False),
    ],
)
def test_strict_request_id_refuses_a_non_uuid_x_request_id(request_id: str | None, admitted: bool) -> None:
    e = engine(strict())
    outcome = send(e, chat(), request_id=request_id, request_id_header=request_id)
    if admitted:
        assert isinstance(outcome, Completed)
        return
    assert error_of(outcome) == (400, None)
    assert isinstance(outcome, Rejected) and outcome.reply.body == {}  # sent as an empty body
    assert e.stats.by_outcome == {"invalid_request_id": 1}
    assert e.stats.by_layer == {"config": 1}


def test_request_ids_are_free_text_unless_the_profile_is_strict() -> None:
    outcome = send(engine(), chat(), request_id="batch-1:row-7", request_id_header="batch-1:row-7")
    assert isinstance(outcome, Completed)
