"""The whole job against a secured broker, as a user runs it: every command reads one Java client properties
file (SASL_SSL with SCRAM-SHA-512, mTLS, OAUTHBEARER from a token endpoint), each principal holds only the ACLs
of its role (design §6), and every way a connection can be misconfigured ends in one line and exit 3."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from streamproc.devstack.broker import free_port
from streamproc.devstack.secure_broker import SecureBroker, SecureBrokerStatus
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, start_mock
from tests.unsecured_jws import unsecured_jws

pytestmark = pytest.mark.integration

REQUESTS = 60


class TokenEndpoint:
    """An OAuth 2 client-credentials endpoint on 127.0.0.1, in a thread of its own; counts the tokens it gave."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.secrets, self.issued = secrets, 0
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    async def _token(self, request: web.Request) -> web.Response:
        kind, _, encoded = request.headers.get("Authorization", "").partition(" ")
        client_id, _, secret = base64.b64decode(encoded or "Og==").decode().partition(":")
        form = await request.post()
        if kind != "Basic" or self.secrets.get(client_id) != secret or form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "invalid_client"}, status=401)
        self.issued += 1
        return web.json_response({"access_token": unsecured_jws(client_id), "token_type": "bearer",
                                  "expires_in": 3600})

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/token", self._token)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> TokenEndpoint:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@dataclass
class Secured:
    settings: Settings
    control: SecureBroker
    broker: SecureBrokerStatus
    files: dict[str, Path]
    """``<principal>-<scram|mtls|oauth>`` -> client properties file."""
    llm_url: str
    tokens: TokenEndpoint


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("secured")
    settings = Settings(data_dir=home, local_kafka_port=0, local_kafka_controller_port=0, partitions=4,
                        retry_tiers="1s,2s")
    broker = SecureBroker(settings)
    status = broker.start()
    mock = start_mock("clean")
    try:
        broker.apply_acls(settings.topology())
        with TokenEndpoint(status.oauth_client_secrets) as tokens:
            files = dict(broker.status().client_properties)
            for principal in ("worker", "submitter", "sink"):
                files[f"{principal}-oauth"] = broker.write_oauth_properties(principal, tokens.url)
            yield Secured(settings, broker, status, files, mock.url, tokens)
    finally:
        mock.stop()
        broker.stop()


def env_for(secured: Secured, properties: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
    env.update({"STREAMPROC_KAFKA_CLIENT_PROPERTIES": str(properties),
                "STREAMPROC_DATA_DIR": str(secured.settings.data_dir),
                "STREAMPROC_PARTITIONS": str(secured.settings.partitions),
                "STREAMPROC_RETRY_TIERS": secured.settings.retry_tiers,
                "STREAMPROC_LLM_BASE_URL": secured.llm_url, "STREAMPROC_LLM_TIMEOUT_S": "5",
                "STREAMPROC_KAFKA_SESSION_TIMEOUT_S": "10"})
    env.update(extra)
    return env


def run(secured: Secured, properties: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env_for(secured, properties),
                          capture_output=True, text=True, timeout=timeout, check=False)


def start_worker(secured: Secured, listener: str, name: str) -> WorkerProcess:
    data_dir = secured.settings.data_dir / f"worker-{name}"
    data_dir.mkdir(exist_ok=True)
    worker = WorkerProcess(env_for(secured, secured.files[f"worker-{listener}"], STREAMPROC_DATA_DIR=str(data_dir)),
                           secured.settings.data_dir / f"worker-{name}.log")
    worker.start()
    return worker


def batch_file(path: Path, prefix: str) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "prompt": f"Question {i}?", "max_tokens": 40}) + "\n"
                            for i in range(REQUESTS)))
    return path


def wait_converged(secured: Secured, properties: Path, batch_id: str, *workers: WorkerProcess,
                   timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    document: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = run(secured, properties, "status", "--batch-id", batch_id, "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        if document.get("converged"):
            return document
        assert any(worker.alive() for worker in workers), "\n".join(worker.log_tail() for worker in workers)
        time.sleep(2)
    raise AssertionError(f"batch {batch_id} did not converge: {document}")


@pytest.mark.parametrize("listener", ["scram", "mtls", "oauth"])
def test_the_whole_job_runs_over_each_secured_listener_with_role_acls_only(
        secured: Secured, listener: str, tmp_path: Path) -> None:
    submitter, sink = secured.files[f"submitter-{listener}"], secured.files[f"sink-{listener}"]
    batch_id = f"secured-{listener}"
    worker = start_worker(secured, listener, listener)
    spare: WorkerProcess | None = None
    try:
        submitted = run(secured, submitter, "submit", str(batch_file(tmp_path / "in.jsonl", listener)),
                        "--batch-id", batch_id)
        assert submitted.returncode == 0, submitted.stderr
        if listener == "scram":  # a worker killed mid-batch: the next one finishes its work, nothing twice
            time.sleep(3)
            worker.signal(signal.SIGKILL)
            worker.stop()
            spare = start_worker(secured, listener, "spare")
        status = wait_converged(secured, submitter, batch_id, spare or worker)
        assert status["succeeded"] + sum(status["failed"].values()) == REQUESTS, status

        exported = run(secured, submitter, "results", "--batch-id", batch_id, "--output", str(tmp_path / "out.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
        assert exported.returncode == 0, exported.stderr
        ids = [json.loads(line)["custom_id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(ids) == len(set(ids)) == status["succeeded"]

        lag = run(secured, submitter, "lag", "--no-rate", "--json")
        assert lag.returncode == 0, lag.stderr
        backfill = run(secured, submitter, "backfill", "--batch-id", batch_id, "--dry-run")
        assert backfill.returncode == 0, backfill.stderr
        cancelled = run(secured, submitter, "cancel", "--batch-id", batch_id)
        assert cancelled.returncode == 0, cancelled.stderr

        database = tmp_path / "outcomes.db"
        sunk = run(secured, sink, "sink", "--to", f"sqlite:///{database}", "--until-idle")
        assert sunk.returncode == 0, sunk.stderr
        with sqlite3.connect(database) as db:
            rows = {row[0] for row in db.execute("SELECT custom_id FROM results WHERE batch = ?", (batch_id,))}
        assert rows == set(ids)
    finally:
        for process in (worker, spare):
            if process is not None and process.alive():
                process.stop()
    if listener == "oauth":
        assert secured.tokens.issued > 0, "the OAUTHBEARER clients never asked the token endpoint"


def test_run_takes_the_cluster_and_its_security_from_the_properties_file(secured: Secured, tmp_path: Path) -> None:
    """``run --command-config``: no built-in broker is started, and the worker it starts gets the file too."""
    result = run(secured, Path("/dev/null"), "run", str(batch_file(tmp_path / "in.jsonl", "run")), "--batch-id",
                 "secured-run", "--workers", "1", "--output", str(tmp_path / "out.jsonl"), "--command-config",
                 str(secured.files["worker-scram"]), "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["status"]["converged"], outcome
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == outcome["status"]["succeeded"] > 0
    assert not (secured.settings.data_dir / "kafka").exists(), "run started a built-in broker"


def test_kafka_refuses_what_a_role_was_not_granted_in_one_line(secured: Secured, tmp_path: Path) -> None:
    refused = run(secured, secured.files["sink-scram"], "submit", str(batch_file(tmp_path / "in.jsonl", "nope")),
                  "--batch-id", "sink-may-not-submit")
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: Kafka refused ") and "lacks that ACL" in refused.stderr


def _variant(source: Path, target: Path, **replace: str) -> Path:
    """A copy of a properties file with some keys set to other values."""
    lines = [line for line in source.read_text().splitlines() if line.split("=", 1)[0] not in replace]
    target.write_text("\n".join([*lines, *(f"{key.replace('_', '.')}={value}" for key, value in replace.items())]))
    return target


class _Forward:
    """127.0.0.2:port -> the broker's TLS port: a host name the broker's certificate does not hold."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.2", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


@pytest.mark.parametrize("case", ["wrong password", "unknown mechanism", "untrusted CA", "hostname mismatch",
                                  "expired client certificate", "plaintext client on a TLS port"])
def test_each_misconfiguration_is_one_line_and_exit_3_within_30s(secured: Secured, case: str,
                                                                  tmp_path: Path) -> None:
    scram, mtls = secured.files["worker-scram"], secured.files["worker-mtls"]
    password = secured.broker.scram_passwords["worker"]
    certificates = secured.broker.certificates
    extra: list[str] = []
    if case == "wrong password":
        properties = _variant(scram, tmp_path / "p", sasl_jaas_config="org.apache.kafka.common.security.scram."
                              'ScramLoginModule required username="worker" password="not-the-password";')
        expected = "refused SASL SCRAM-SHA-512 authentication for user 'worker'"
    elif case == "unknown mechanism":
        plain = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="worker" '
                 f'password="{password}";')
        properties = _variant(scram, tmp_path / "p", sasl_mechanism="PLAIN", sasl_jaas_config=plain)
        expected = "does not enable SASL mechanism PLAIN"
    elif case == "untrusted CA":
        properties = _variant(scram, tmp_path / "p", ssl_truststore_location=str(certificates["other-ca"]))
        expected = "is not signed by the CA in"
    elif case == "hostname mismatch":
        forward = _Forward(int(secured.broker.listeners["scram"].rsplit(":", 1)[1]))
        properties = scram
        extra = ["-b", f"127.0.0.2:{forward.port}"]
        expected = "does not name that host"
    elif case == "expired client certificate":
        properties = _variant(mtls, tmp_path / "p", ssl_keystore_location=str(certificates["worker-expired"]))
        expected = "refused our client certificate"
    else:
        properties = Path("/dev/null")
        extra = ["-b", secured.broker.listeners["scram"]]
        expected = "may expect TLS"
    began = time.monotonic()
    result = run(secured, properties, "batches", *extra, timeout=60)
    assert time.monotonic() - began < 30
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr
    assert password not in result.stderr + result.stdout
    if case == "expired client certificate":
        assert "expired on" in result.stderr


def test_a_worker_refused_by_the_cluster_stops_with_the_reason(secured: Secured, tmp_path: Path) -> None:
    properties = _variant(secured.files["worker-scram"], tmp_path / "p", sasl_jaas_config="org.apache.kafka.common."
                          'security.scram.ScramLoginModule required username="worker" password="wrong";')
    worker = WorkerProcess(env_for(secured, properties, STREAMPROC_DATA_DIR=str(tmp_path)), tmp_path / "worker.log")
    worker.start()
    assert worker.process is not None
    assert worker.process.wait(timeout=60) == 3
    assert "refused SASL SCRAM-SHA-512 authentication" in worker.log_tail()


def test_a_worker_that_loses_its_write_acl_mid_run_stops_and_acks_nothing_unwritten(
        secured: Secured, tmp_path: Path) -> None:
    slow = start_mock("clean", 7, "--latency", "0.3")
    admin = secured.broker.client_properties["broker-admin"]
    write_acl = ["--allow-principal", "User:worker", "--operation", "Write", "--topic",
                 f"{secured.settings.topic_prefix}.", "--resource-pattern-type", "prefixed"]
    worker = WorkerProcess(env_for(secured, secured.files["worker-scram"], STREAMPROC_DATA_DIR=str(tmp_path / "w1"),
                                   STREAMPROC_LLM_BASE_URL=slow.url, STREAMPROC_IN_FLIGHT="4"), tmp_path / "w1.log")
    spare: WorkerProcess | None = None
    try:
        worker.start()
        submitted = run(secured, secured.files["submitter-scram"], "submit",
                        str(batch_file(tmp_path / "in.jsonl", "acl")), "--batch-id", "acl-loss")
        assert submitted.returncode == 0, submitted.stderr
        time.sleep(5)
        removed = secured.control.run_tool("kafka.admin.AclCommand", [
            "--bootstrap-server", secured.broker.listeners["mtls"], "--command-config", str(admin), "--remove",
            "--force", *write_acl], timeout=120)
        assert removed.returncode == 0, removed.stderr
        assert worker.process is not None
        assert worker.process.wait(timeout=90) == 3, worker.log_tail()
        assert "STOPPING: Kafka refused Write on Topic" in worker.log_path.read_text()
        halted = json.loads(run(secured, secured.files["submitter-scram"], "status", "--batch-id", "acl-loss",
                                "--json").stdout)
        assert not halted["converged"]
    finally:  # apply_acls would skip a plan it applied before: put the one ACL back by hand
        restored = secured.control.run_tool("kafka.admin.AclCommand", [
            "--bootstrap-server", secured.broker.listeners["mtls"], "--command-config", str(admin), "--add",
            *write_acl], timeout=120)
        assert restored.returncode == 0, restored.stderr
    try:  # the permission back, a new worker finishes the batch: every request ends once
        spare = WorkerProcess(env_for(secured, secured.files["worker-scram"],
                                      STREAMPROC_DATA_DIR=str(tmp_path / "w2"), STREAMPROC_LLM_BASE_URL=slow.url),
                              tmp_path / "w2.log")
        spare.start()
        status = wait_converged(secured, secured.files["submitter-scram"], "acl-loss", spare)
        assert status["succeeded"] + sum(status["failed"].values()) == REQUESTS, status
    finally:
        for process in (worker, spare):
            if process is not None and process.alive():
                process.stop()
        slow.stop()
