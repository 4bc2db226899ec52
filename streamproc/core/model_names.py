"""What a model name may be: the request topic is an interface, and a model name becomes a metric label, a
key of every per-model guard and a database column, so a hostile one must be refused before it is any of these.

A name is 1 to :data:`MAX_MODEL_NAME` characters from a conservative printable ASCII set: letters, digits and
``. _ - : / @ + =``. That covers the names providers use (``gpt-4o-mini-2024-07-18``,
``meta-llama/Llama-3.1-8B-Instruct``, ``ft:gpt-4o-mini:org:tag:id``, ``llama3.1:8b``,
``claude-3-5-sonnet@20240620``, ``mistral.mistral-large-2402-v1:0``) and leaves out spaces, quotes, control
characters and anything non-ASCII.
"""

from __future__ import annotations

import re

MAX_MODEL_NAME = 256
INVALID_MODEL_NAME = "invalid_model_name"  # the business failure of a request whose model is no model name
ALLOWED = "ASCII letters, digits and . _ - : / @ + ="
_NAME = re.compile(r"[A-Za-z0-9._\-:/@+=]+")
_OUTSIDE = re.compile(r"[^A-Za-z0-9._\-:/@+=]")


def model_name_problem(name: str) -> str | None:
    """Why ``name`` is no model name (a phrase after "model ..."), or None when it is one."""
    if not name:
        return "is empty"
    if len(name) > MAX_MODEL_NAME:
        return f"is {len(name):,} characters, over the {MAX_MODEL_NAME}-character limit"
    if _NAME.fullmatch(name) is None:
        found = _OUTSIDE.search(name)
        assert found is not None
        return f"has {found.group()!r} at position {found.start()}: a model name is {ALLOWED}"
    return None
