"""Reading batch input files, validated line by line (design §6): what ``submit`` checks and then sends.

``submit`` validates the whole file before sending anything, so every problem is reported with its line
number (what a line may hold: :mod:`streamproc.ops.input_lines`). Files of millions of lines are streamed:
one line in memory at a time, each capped in size before it is read, duplicate ids remembered on disk.
"""

from __future__ import annotations

import codecs
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from rocksdict import Options, Rdict, WriteOptions

from streamproc.core.events import InferenceRequest
from streamproc.core.identity import custom_id_of
from streamproc.ops.input_lines import LINE_CAP_FACTOR, BatchLimits, LineError, parse_line


@dataclass(frozen=True)
class ValidationReport:
    """One pass over a file: ``lines`` read (blank ones included), ``valid`` requests, the first errors."""

    valid: int
    errors: list[LineError]  # the first ``max_errors``, in line order
    error_count: int  # all of them
    lines: int


class BatchFileError(ValueError):
    """An invalid line met by :func:`iter_requests` without ``skip_invalid``."""

    def __init__(self, error: LineError) -> None:
        super().__init__(str(error))
        self.error = error


class DuplicateDetector:
    """Remembers ids in a throw-away RocksDB, so millions of them cost disk, not memory.

    ``seen(id, line)`` answers the line of the id's first occurrence, or records ``line`` and answers None.
    The database lives in a temporary directory (under ``directory`` when given: keep it off a tmpfs for big
    files) removed on exit. No write-ahead log: the data is worthless after a crash.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._db: Rdict | None = None

    def __enter__(self) -> Self:
        self._tmp = tempfile.TemporaryDirectory(prefix="streamproc-ids-", dir=self._directory)
        options = Options(raw_mode=True)
        options.set_write_buffer_size(16 * 1024 * 1024)
        self._db = Rdict(str(Path(self._tmp.name) / "ids"), options)
        write_options = WriteOptions()
        # a property at run time; rocksdict 0.3.29's stub declares a method
        write_options.disable_wal = True  # type: ignore[method-assign,assignment]
        self._db.set_write_options(write_options)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def seen(self, custom_id: str, line: int) -> int | None:
        if self._db is None:
            raise RuntimeError("DuplicateDetector is used outside its with block")
        key = custom_id.encode("utf-8")
        first: bytes | None = self._db.get(key)
        if first is not None:
            return int.from_bytes(first, "little")
        self._db.put(key, line.to_bytes(8, "little"))
        return None


def validate_file(
    path: Path, limits: BatchLimits, batch_id: str, max_errors: int = 100, *, tmp_dir: Path | None = None
) -> ValidationReport:
    """Check every line once, streaming; keeps the first ``max_errors`` errors and counts the rest."""
    valid = error_count = lines = 0
    errors: list[LineError] = []
    for line, outcome in _outcomes(path, limits, batch_id, 0, tmp_dir):
        lines = line
        if isinstance(outcome, LineError):
            error_count += 1
            if len(errors) < max_errors:
                errors.append(outcome)
        elif outcome is not None:
            valid += 1
    return ValidationReport(valid, errors, error_count, lines)


def iter_requests(
    path: Path,
    limits: BatchLimits,
    batch_id: str,
    submitted_ms: int,
    skip_invalid: bool,
    *,
    tmp_dir: Path | None = None,
) -> Iterator[InferenceRequest]:
    """The file's valid requests in line order, streaming; without ``skip_invalid`` an invalid or duplicate
    line raises :class:`BatchFileError` (callers validate first, so that means the file changed).

    Yields exactly ``validate_file(...).valid`` requests for an unchanged file.
    """
    for _, outcome in _outcomes(path, limits, batch_id, submitted_ms, tmp_dir):
        if isinstance(outcome, InferenceRequest):
            yield outcome
        elif outcome is not None and not skip_invalid:
            raise BatchFileError(outcome)


def _outcomes(
    path: Path, limits: BatchLimits, batch_id: str, submitted_ms: int, tmp_dir: Path | None
) -> Iterator[tuple[int, InferenceRequest | LineError | None]]:
    """Every line's outcome, duplicates included: the first line with an id owns it, even when that line is
    invalid (a later copy would be a guess at which one was meant)."""
    with DuplicateDetector(tmp_dir) as ids:
        for line, text in _read_lines(path, limits.max_line_bytes):
            outcome = text if isinstance(text, LineError) else parse_line(text, line, limits, batch_id, submitted_ms)
            if outcome is None:
                yield line, None
                continue
            if isinstance(outcome, InferenceRequest):
                custom_id: str | None = custom_id_of(outcome.request_id, outcome.batch_id)
            else:
                custom_id = outcome.custom_id
            if custom_id is not None:
                first = ids.seen(custom_id, line)
                if first is not None and isinstance(outcome, InferenceRequest):
                    outcome = LineError(line, custom_id, f"duplicate custom_id {custom_id!r} (first on line {first})")
            yield line, outcome


def _read_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, str | LineError]]:
    """Numbered lines without their ``\\n`` / ``\\r\\n`` (and the BOM of line 1), decoded, or why not."""
    with path.open("rb") as file:
        line = 0
        while raw := file.readline(max_line_bytes + 1):
            line += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):
                    raw = file.readline(1 << 20)
                reason = f"line is over {max_line_bytes:,} bytes ({LINE_CAP_FACTOR} times the body limit), not read"
                yield line, LineError(line, None, reason)
                continue
            if line == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                yield line, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte {exc.start + 1}"
                yield line, LineError(line, None, reason)
