"""Token estimates without a tokenizer: chat and completion bodies, odd shapes, the cost, calibration."""

from __future__ import annotations

from typing import Any

import pytest

from streamproc.core.guards.token_estimate import TokenEstimator


def chat(*contents: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents], **extra}


def test_chat_text_is_chars_over_four_plus_message_and_reply_overheads() -> None:
    estimator = TokenEstimator()
    assert estimator.raw(chat("x" * 40)) == 10 + 4 + 3
    assert estimator.raw(chat("x" * 40, "y" * 8)) == 10 + 2 + 2 * 4 + 3


def test_each_text_rounds_up() -> None:
    assert TokenEstimator().raw(chat("abcde")) == 2 + 4 + 3


def test_an_empty_chat_counts_only_the_reply() -> None:
    assert TokenEstimator().raw({"messages": []}) == 3


def test_content_parts_count_text_and_images() -> None:
    body = chat([
        {"type": "text", "text": "x" * 20},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "y" * 4},
    ])
    assert TokenEstimator().raw(body) == 5 + 85 + 1 + 4 + 3


def test_odd_shapes_count_what_is_countable_and_never_raise() -> None:
    body: dict[str, Any] = {
        "messages": [
            "not a message",
            {"role": "user"},  # no content: only the overhead
            {"role": "user", "content": None},
            {"role": "user", "content": 42},
            {"role": "user", "content": [None, 7, "abcd", {"type": "text"}, {"type": "text", "text": 5},
                                         {"type": "input_audio"}, {"text": "abcdabcd"}]},
        ],
    }
    assert TokenEstimator().raw(body) == 4 * 4 + 1 + 2 + 3


@pytest.mark.parametrize("body", [{}, {"messages": "hello"}, {"messages": None}, {"prompt": None},
                                  {"prompt": {"text": "x"}}, {"prompt": 3}])
def test_bodies_without_countable_text_count_zero(body: dict[str, Any]) -> None:
    assert TokenEstimator().raw(body) == 0


def test_completion_prompt_string_and_list() -> None:
    estimator = TokenEstimator()
    assert estimator.raw({"prompt": "x" * 10}) == 3  # no chat overheads
    assert estimator.raw({"prompt": ["x" * 8, "y" * 4]}) == 3


def test_completion_prompt_token_ids_are_counted_exactly() -> None:
    estimator = TokenEstimator()
    assert estimator.raw({"prompt": [1, 2, 3]}) == 3
    assert estimator.raw({"prompt": [[1, 2], [3, 4, 5], "abcd", None, True]}) == 2 + 3 + 1


def test_prompt_tokens_apply_the_ratio_rounding_up() -> None:
    estimator = TokenEstimator(alpha=1.0)
    estimator.calibrate(raw=100, actual_prompt_tokens=110)  # ratio 1.1 (100 x 1.1 is 110.00000000000001)
    assert estimator.prompt_tokens({"prompt": "x" * 400}) == 110
    assert estimator.prompt_tokens({"prompt": "x" * 4}) == 2  # 1.1 rounds up


def test_max_tokens_prefers_max_completion_tokens_then_max_tokens_then_the_default() -> None:
    estimator = TokenEstimator(default_max_tokens=99)
    assert estimator.max_tokens({"max_completion_tokens": 10, "max_tokens": 20}) == 10
    assert estimator.max_tokens({"max_tokens": 20}) == 20
    assert estimator.max_tokens({}) == 99
    assert estimator.max_tokens({"max_completion_tokens": None, "max_tokens": 0}) == 0


@pytest.mark.parametrize("value", ["10", 1.5, True, -1, None, [10]])
def test_garbage_max_tokens_fall_back_to_the_default(value: Any) -> None:
    assert TokenEstimator(default_max_tokens=7).max_tokens({"max_tokens": value}) == 7


def test_cost_is_prompt_plus_completion_allowance() -> None:
    estimator = TokenEstimator(default_max_tokens=256)
    assert estimator.cost(chat("x" * 40)) == 17 + 256
    assert estimator.cost(chat("x" * 40, max_tokens=50)) == 17 + 50


def test_calibration_is_an_ewma_of_actual_over_raw() -> None:
    estimator = TokenEstimator(alpha=0.5)
    assert estimator.ratio == 1.0
    estimator.calibrate(raw=100, actual_prompt_tokens=200)
    assert estimator.ratio == pytest.approx(1.5)
    estimator.calibrate(raw=100, actual_prompt_tokens=200)
    assert estimator.ratio == pytest.approx(1.75)


def test_calibration_converges_to_the_true_ratio() -> None:
    estimator = TokenEstimator()
    for _ in range(300):
        estimator.calibrate(raw=40, actual_prompt_tokens=52)
    assert estimator.ratio == pytest.approx(1.3, rel=1e-3)
    assert estimator.prompt_tokens({"prompt": "x" * 160}) == 52


def test_the_ratio_is_clamped() -> None:
    estimator = TokenEstimator(alpha=1.0)
    estimator.calibrate(raw=1, actual_prompt_tokens=1000)
    assert estimator.ratio == 4.0
    estimator.calibrate(raw=1000, actual_prompt_tokens=1)
    assert estimator.ratio == 0.25


@pytest.mark.parametrize(("raw", "actual"), [(0, 10), (-5, 10), (10, 0), (10, -1)])
def test_calibration_ignores_non_positive_samples(raw: int, actual: int) -> None:
    estimator = TokenEstimator(alpha=1.0)
    estimator.calibrate(raw, actual)
    assert estimator.ratio == 1.0


@pytest.mark.parametrize(("default", "alpha"), [(-1, 0.05), (256, 0.0), (256, 1.5)])
def test_invalid_settings_are_rejected(default: int, alpha: float) -> None:
    with pytest.raises(ValueError):
        TokenEstimator(default, alpha)
