"""The migrations list and the write statements, as text."""

from __future__ import annotations

import pytest

from streamproc.sink import schema
from streamproc.sink.schema import MIGRATIONS, Migration, SchemaTooNewError, pending, placeholders


def test_versions_count_up_from_one_without_gaps() -> None:
    assert [migration.version for migration in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


def test_pending_applies_only_what_is_above_the_database() -> None:
    migrations = (Migration(1, "a", ("x",)), Migration(2, "b", ("y",)), Migration(3, "c", ("z",)))
    assert [m.version for m in pending(0, migrations)] == [1, 2, 3]
    assert [m.version for m in pending(2, migrations)] == [3]
    assert pending(3, migrations) == []
    with pytest.raises(SchemaTooNewError, match="version 4, this streamproc knows up to 3"):
        pending(4, migrations)


def test_placeholders_in_the_drivers_style() -> None:
    assert placeholders("UPDATE t SET a = ? WHERE b = ?", "%s") == "UPDATE t SET a = %s WHERE b = %s"
    assert placeholders("UPDATE t SET a = ?", "?") == "UPDATE t SET a = ?"


def test_a_failure_upsert_never_touches_the_key_or_resolved() -> None:
    updated = schema.UPSERT_FAILURE.split("DO UPDATE SET", 1)[1]
    assert "resolved" not in updated and "batch =" not in updated and "attempt =" not in updated
    assert "excluded.failed_at >= failures.failed_at" in updated
