"""submit refuses a line whose model is no model name (core/model_names.py), naming the line and the reason."""

from __future__ import annotations

import json

from streamproc.ops.input_lines import BatchLimits, LineError, parse_line


def test_submit_refuses_a_line_whose_model_is_no_model_name() -> None:
    limits = BatchLimits()
    batch = json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "gpt 4", "messages": [{"role": "user", "content": "hi"}]}})
    refused = parse_line(batch, 3, limits, "b", 0)
    assert isinstance(refused, LineError) and refused.custom_id == "c1"
    assert "body.model has ' ' at position 3" in str(refused) and "line 3" in str(refused)
    simple = parse_line(json.dumps({"id": "s1", "prompt": "hi", "model": "x" * 300}), 4, limits, "b", 0)
    assert isinstance(simple, LineError) and "model is 300 characters" in str(simple)
    assert not isinstance(parse_line(json.dumps({"id": "s2", "prompt": "hi", "model": "org/m:1"}), 5, limits, "b", 0),
                          LineError)
