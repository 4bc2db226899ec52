"""A faust app with a rocksdict-backed table against the real broker, across a worker restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import AccessType, Rdict

from streamproc.app.roundtrip import run_round_trip
from streamproc.settings import Settings

pytestmark = pytest.mark.integration


async def test_table_survives_worker_restart(settings: Settings, tmp_path: Path) -> None:
    report = await run_round_trip(settings, records=300, log_path=str(tmp_path / "worker.log"))

    assert report.first_pass_ok, (tmp_path / "worker.log").read_text()[-3000:]
    # every key's total went 1 -> 2, so the second worker started from the first one's table
    assert report.second_pass_ok, (tmp_path / "worker.log").read_text()[-3000:]
    tables = sorted((settings.data_dir / "faust").glob("*/v1/tables/totals-*.db"))
    assert len(tables) == 4  # one RocksDB per partition
    stored = 0
    for path in tables:
        db = Rdict(str(path), access_type=AccessType.read_only())
        try:
            user_keys = [key for key in db.keys() if isinstance(key, bytes) and not key.startswith(b"__faust")]  # noqa: SIM118
            stored += len(user_keys)
        finally:
            db.close()
    assert stored == 300
