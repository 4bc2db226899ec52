"""Credentials kept out of the worker's log, whichever logger writes the line (ours, faust's, aiohttp's).

faust's worker replaces the root logger's handlers when it starts, and a filter on a logger sees only the
records made there, not those propagated from its children. So the filter runs where every record is made:
:func:`install` wraps the log record factory, and each record leaves it with its message (and its traceback)
already formatted and redacted by :func:`streamproc.core.redact.redact`.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from streamproc.core.redact import redact


class RedactingFilter(logging.Filter):
    """Redacts a record in place: ``Bearer`` tokens, ``sk-`` keys, ``Authorization`` values, URL credentials and
    the configured ``secrets``; never drops a record."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it itself when it formats the record
            return True
        # an empty tuple, not None: mode's formatter wraps a non-tuple into one and formats the message again
        record.msg, record.args = redact(message, self.secrets), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True


def install(secrets: Iterable[str] = ()) -> RedactingFilter:
    """Redact every log record this process makes from now on; returns the filter."""
    redacting = RedactingFilter(secrets)
    make: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        redacting.filter(record)
        return record

    logging.setLogRecordFactory(factory)
    return redacting
