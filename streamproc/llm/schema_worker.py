"""The child process :mod:`streamproc.llm.schema_check` validates answers in: one JSON line in
(``[content, response_format]``), one JSON line out (``null`` or ``[layer, code, message]``).

A process, not a thread: a ``pattern`` that backtracks runs inside ``re`` for as long as it likes, and only
a process can be stopped at the deadline. It ends when its stdin closes (the worker is gone).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

from streamproc.llm.completion import check_format

READY = "ready"


def answer(line: str) -> list[Any] | None:
    """The reply to one request line."""
    content, response_format = json.loads(line)
    try:
        problem = check_format(content, response_format)
    except Exception as exc:  # any error of jsonschema's is the schema's: the request's fault
        return ["business", "invalid_json_schema", f"response_format.json_schema.schema cannot be applied: "
                f"{type(exc).__name__}: {exc}"]
    return None if problem is None else [problem.layer.value, problem.code, problem.message]


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the worker's to handle; it closes our stdin
    print(READY, flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(line)), flush=True)


if __name__ == "__main__":
    main()
