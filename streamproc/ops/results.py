"""``results``: write a batch's outcomes as OpenAI batch output and error files, one line per custom_id.

The results topic may hold duplicates (a crash between the result and the state write); the
:class:`ExportDeduper` settles each id on one line, so downstream files are exact.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from streamproc import codec
from streamproc.app.bootstrap import resolve_bootstrap
from streamproc.app.topic_reader import TopicReader
from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.ops.output_format import ExportCounts, ExportDeduper
from streamproc.settings import Settings


@dataclass(frozen=True)
class ExportReport:
    output: Path
    errors_path: Path | None
    results: int
    failures: int
    counts: ExportCounts


def export_results(settings: Settings, batch_id: str, output: Path, errors: Path | None) -> ExportReport:
    """Stream results and terminal failures of ``batch_id`` into the two files."""
    with open(output, "w", encoding="utf-8") as out:
        deduper, written = asyncio.run(_write_results(settings, batch_id, out))
    failed = 0
    if errors is not None:
        with open(errors, "w", encoding="utf-8") as err:
            for line in deduper.error_lines():
                err.write(json.dumps(line, ensure_ascii=False) + "\n")
                failed += 1
    else:
        failed = sum(1 for _ in deduper.error_lines())
    return ExportReport(output, errors, written, failed, deduper.counts)


async def _write_results(settings: Settings, batch_id: str, out: TextIO) -> tuple[ExportDeduper, int]:
    """Write result lines as they are read; hold failures in the deduper (a later result may beat them)."""
    topology = settings.topology()
    failure_topics = sorted(topology.failed(layer) for layer in FailureLayer)
    deduper = ExportDeduper()
    written = 0
    async with TopicReader(resolve_bootstrap(settings), [topology.results, *failure_topics]) as reader:
        async for chunk in reader.chunks_to_end():
            for record in chunk:
                try:
                    if record.topic == topology.results:
                        result = codec.decode(record.value, InferenceResult)
                        if result.batch_id == batch_id and (line := deduper.add_result(result)) is not None:
                            out.write(json.dumps(line, ensure_ascii=False) + "\n")
                            written += 1
                    else:
                        failure = codec.decode(record.value, FailureEvent)
                        if failure.request.batch_id == batch_id:
                            deduper.add_failure(failure)
                except codec.CodecError:
                    continue  # a foreign record: not part of any batch's outcome
    return deduper, written
