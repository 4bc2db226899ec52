"""Text that both databases store and give back unchanged, whatever a record carried.

PostgreSQL refuses a NUL in ``text`` and neither database can encode a lone surrogate (a JSON ``"\\ud800"``
decodes to one) as UTF-8. Such a value is stored as its JSON string literal, quotes included
(``a<NUL>b`` → ``"a\\u0000b"``): readable, and :func:`restored` turns it back. To keep that unambiguous, a
value that already starts and ends with ``"`` is stored as its literal too; every other value is stored as it
is, so ids and answers stay queryable as they were.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple, TypeVar

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

Row = TypeVar("Row", bound=NamedTuple)


def _needs_literal(value: str) -> bool:
    return (len(value) >= 2 and value[0] == '"' and value[-1] == '"') or _UNSTORABLE.search(value) is not None


def storable(value: str) -> str:
    """``value`` as it is, or as its JSON string literal when the database could not keep it (see above)."""
    if not _needs_literal(value):
        return value
    literal = json.dumps(value, ensure_ascii=False)  # NUL becomes \u0000; a lone surrogate stays raw
    return _LONE_SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", literal)


def restored(value: str) -> str:
    """The value :func:`storable` was given."""
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        try:
            decoded = json.loads(value)
        except ValueError:  # not written by storable: as it is
            return value
        if isinstance(decoded, str):
            return decoded
    return value


def storable_row(row: Row) -> Row:
    """``row`` with every text field :func:`storable`."""
    return row._replace(**{name: storable(value) for name, value in row._asdict().items()
                           if isinstance(value, str) and _needs_literal(value)})


def restored_row(row: Row) -> Row:
    """``row`` as read back, with every text field :func:`restored`."""
    return row._replace(**{name: restored(value) for name, value in row._asdict().items() if isinstance(value, str)})
