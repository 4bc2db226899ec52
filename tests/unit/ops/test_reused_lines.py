"""A result answered from an earlier identical request (``--reuse-results``) is an ordinary OpenAI output line,
marked under our own key with the request its answer came from."""

from __future__ import annotations

import json
from dataclasses import replace

from openai.types.chat import ChatCompletion

from streamproc.ops.openai_lines import output_line
from tests.batch_lines import parse_openai_line
from tests.unit.ops.test_output_format import result


def test_a_reused_answer_names_its_origin_under_streamproc_and_still_parses_as_openais() -> None:
    line = output_line(replace(result(), reused_from="earlier/req-1"))
    assert line["streamproc"] == {"reused_from": "earlier/req-1"}
    _, body = parse_openai_line(json.dumps(line))
    assert isinstance(body, ChatCompletion)
    assert "streamproc" not in output_line(result())  # an answer called for carries no mark


def test_the_deployment_that_answered_is_exported_under_streamproc() -> None:
    line = output_line(replace(result(), deployment="gpt-4o@2"))
    assert line["streamproc"] == {"deployment": "gpt-4o@2"}
    _, body = parse_openai_line(json.dumps(line))
    assert isinstance(body, ChatCompletion)
