"""A rolling upgrade on the real broker: the previous release, installed from its tag's commit into its own
virtualenv, submits a batch and starts on it with two workers; then one worker at a time is replaced by this
release with ``STREAMPROC_UPGRADE_FROM`` naming the old one, and the batch ends with every request answered
once. While the old release still runs, everything written must be readable by it: every Avro record on the
results topic and the state changelog carries a schema that release wrote. A second restart without the
setting then runs a new batch with the current schemas (design §6, "Releases and rolling upgrades").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from streamproc.codec.framing import SINGLE_OBJECT_MAGIC
from streamproc.codec.releases import Release, releases
from streamproc.core.identity import request_id_for
from streamproc.settings import Settings
from tests.integration.pipeline import MockServer, OutcomeReader, WorkerProcess, start_mock, worker_env
from tests.integration.test_pipeline_faults import wait_for_assignment

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 600


def _previous_release() -> Release:
    return list(releases().values())[-1]


def _install(release: Release, into: Path) -> str:
    """The release's source from git (its tag's commit) in a virtualenv of its own; returns its python.

    When the release pins the same dependencies as this checkout (constraints.txt and pyproject's list), the
    virtualenv reuses this environment's packages (a .pth after the release's source) instead of downloading
    them again; otherwise pip installs the release with its own pins.
    """
    source = into / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", release.commit],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.fail(f"release {release.version}: commit {release.commit} is not in this clone's history "
                    f"(git archive: {archive.stderr.decode(errors='replace').strip()}); a rolling upgrade test "
                    "needs the repository's history")
    archive_path = into / "source.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(source, filter="tar")
    venv = into / "venv"
    same_pins = ((source / "constraints.txt").read_bytes() == (ROOT / "constraints.txt").read_bytes()
                 and _dependencies(source) == _dependencies(ROOT))
    subprocess.run([sys.executable, "-m", "venv", *(["--without-pip"] if same_pins else []), str(venv)], check=True)
    python = str(venv / "bin" / "python")
    if same_pins:
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "streamproc_release.pth").write_text(f"{source}\n{sysconfig.get_paths()['purelib']}\n")
    else:
        subprocess.run([python, "-m", "pip", "install", "-q", "-c", str(source / "constraints.txt"), str(source)],
                       check=True)
    version = subprocess.run([python, "-c", "import streamproc; print(streamproc.__version__)"],
                             capture_output=True, text=True, check=True, env=_clean_env(), cwd=into).stdout.strip()
    assert version == release.version, f"the virtualenv runs streamproc {version}, not {release.version}"
    return python


def _dependencies(root: Path) -> list[str]:
    return list(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _batch_file(path: Path, prefix: str, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            body = {"model": "mock-small", "max_tokens": 256,
                    "messages": [{"role": "user", "content": f"Summarise item {i} of the upgrade batch."}]}
            out.write(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": body}) + "\n")
    return path


def _submit(python: str, env: dict[str, str], file: Path, batch_id: str) -> None:
    """``streamproc submit`` of that interpreter's release (run beside the file: ``-m`` imports from there first)."""
    done = subprocess.run([python, "-m", "streamproc", "submit", str(file), "--batch-id", batch_id],
                          env=env, capture_output=True, text=True, timeout=120, check=False, cwd=file.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def _say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def _wait_calls(mock: MockServer, calls: int, timeout_s: float) -> None:
    _say(f"waiting for {calls} calls")
    deadline = time.monotonic() + timeout_s
    while mock.stats()["calls"] < calls:
        assert time.monotonic() < deadline, f"fewer than {calls} calls in {timeout_s} s"
        await asyncio.sleep(0.2)


async def _fingerprints(bootstrap: str, topics: list[str]) -> dict[str, set[bytes]]:
    """The schema fingerprints of every single-object record on these topics, per topic."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    found: dict[str, set[bytes]] = {topic: set() for topic in topics}
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=2000, max_records=5000)
            if not batches:
                return found
            for tp, messages in batches.items():
                for message in messages:
                    if message.value and message.value[:2] == SINGLE_OBJECT_MAGIC:
                        found[tp.topic].add(bytes(message.value[2:10]))
    finally:
        await consumer.stop()


async def test_one_worker_at_a_time_from_the_previous_release(settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    release = _previous_release()
    old_python = _install(release, tmp_path / "old")
    mock = start_mock("clean", 5, "--latency", "2")
    # few calls at a time, so the batch lasts through both replacements (about 75 s)
    env = {name: worker_env(settings, mock.url, tmp_path / name, in_flight="8", llm_hedge_ratio="0")
           for name in ("a", "b")}
    cli_env = {**_clean_env(), **{k: v for k, v in env["a"].items() if k.startswith("STREAMPROC_")}}
    upgrading = {name: {**env[name], "STREAMPROC_UPGRADE_FROM": release.version} for name in env}
    old_env = {name: {k: v for k, v in env[name].items() if k != "PYTHONPATH"} for name in env}
    old = {name: WorkerProcess(old_env[name], tmp_path / f"old-{name}.log", python=old_python, cwd=tmp_path)
           for name in env}
    new = {name: WorkerProcess(upgrading[name], tmp_path / f"new-{name}.log") for name in env}
    current = {name: WorkerProcess(env[name], tmp_path / f"current-{name}.log") for name in env}
    first = [request_id_for("upgrade-1", f"up-{i}") for i in range(REQUESTS)]
    second = [request_id_for("upgrade-2", f"after-{i}") for i in range(REQUESTS // 4)]
    topology = settings.topology()
    try:
        _submit(old_python, cli_env, _batch_file(tmp_path / "first.jsonl", "up", REQUESTS), "upgrade-1")
        _say("submitted by the old release")
        old["a"].start()
        old["b"].start()
        await _wait_calls(mock, REQUESTS // 4, 180)
        assert old["a"].stop() == 0
        _say("old worker a stopped")
        new["a"].start()  # the group now holds an old and a new worker
        await wait_for_assignment(settings.kafka_bootstrap, settings.app_id, members=2, timeout_s=90)
        mixed_from = mock.stats()["calls"]
        await _wait_calls(mock, mixed_from + REQUESTS // 4, 180)
        assert old["b"].stop() == 0
        _say("old worker b stopped")
        new["b"].start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(first, 300, new["a"], new["b"])
        _say(f"the upgraded batch: {len(outcomes.unfinished(first))} unfinished")
        written = await _fingerprints(settings.kafka_bootstrap, [topology.results, topology.state_changelog])
        for worker in new.values():  # the second restart: every worker is new, the setting goes
            assert worker.stop() == 0
        for worker in current.values():
            worker.start()
        _submit(sys.executable, cli_env, _batch_file(tmp_path / "second.jsonl", "after", len(second)), "upgrade-2")
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            after = await reader.wait_until_ended(second, 300, *current.values())
    finally:
        for worker in (*old.values(), *new.values(), *current.values()):
            worker.stop()
        mock.stop()
    logs = "\n".join(w.log_tail(200_000) for w in (*old.values(), *new.values()))
    unfinished = outcomes.unfinished(first)
    assert not unfinished, f"{len(unfinished)} requests of the upgraded batch never ended: {unfinished[:5]}"
    assert not outcomes.failures, {k: [f.error_code for f in v] for k, v in list(outcomes.failures.items())[:5]}
    repeated = [i for i in first if len(outcomes.results[i]) > 1]
    assert not repeated, f"{len(repeated)} requests answered twice across graceful replacements: {repeated[:5]}"
    assert "undecodable" not in logs and "unknown writer schema" not in logs
    release_writes = {writer.fingerprint for writer in release.writes}
    for topic, fingerprints in written.items():
        assert fingerprints and fingerprints <= release_writes, (topic, [f.hex() for f in fingerprints])
    assert not after.unfinished(second) and not after.failures

