"""``results``: write a batch's outcomes, one line per custom_id, as OpenAI's batch output and error files or
as Anthropic's Message Batches results file (:data:`FORMATS`).

The results topic may hold duplicates (a crash between the result and the state write); the
:class:`ExportDeduper` settles each id on one line, so downstream files are exact.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from streamproc import codec
from streamproc.app.topic_reader import TopicReader
from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.ops import anthropic_lines, openai_lines
from streamproc.ops.output_format import ExportCounts, ExportDeduper, LineFormat

FORMATS: dict[str, LineFormat] = {"openai": openai_lines, "anthropic": anthropic_lines}
"""Export formats by name: OpenAI's two files (results, errors), or Anthropic's one file."""
ONE_FILE_FORMATS = frozenset({"anthropic"})


@dataclass(frozen=True)
class ExportReport:
    output: Path
    errors_path: Path | None
    results: int
    failures: int
    counts: ExportCounts

    def as_json(self) -> dict[str, Any]:
        """``results --json``: where the lines went and how many (failures are counted when not written too)."""
        return {"output": str(self.output), "results": self.results,
                "errors": None if self.errors_path is None else str(self.errors_path), "failures": self.failures}


def export_results(kafka: KafkaConnection, topology: Topology, batch_id: str, output: Path, errors: Path | None,
                   format_name: str = "openai", schema_lookup: codec.SchemaLookup | None = None) -> ExportReport:
    """Stream results and terminal failures of ``batch_id`` into the files: failures into ``errors``; without
    it, after the results into ``output`` for a one-file format, and nowhere for OpenAI's."""
    line_format = FORMATS[format_name]
    into_output = errors is None and format_name in ONE_FILE_FORMATS
    with open(output, "w", encoding="utf-8") as out:
        deduper, written = asyncio.run(_write_results(kafka, topology, batch_id, out, line_format,
                                                             schema_lookup))
        failed = _write_failures(deduper, line_format, out) if into_output else 0
    if errors is not None:
        with open(errors, "w", encoding="utf-8") as err:
            failed = _write_failures(deduper, line_format, err)
    elif not into_output:
        failed = sum(1 for _ in deduper.failures())
    return ExportReport(output, errors, written, failed, deduper.counts)


def _write_failures(deduper: ExportDeduper, line_format: LineFormat, out: TextIO) -> int:
    written = 0
    for custom_id, failure in deduper.failures():
        out.write(json.dumps(line_format.error_line(custom_id, failure), ensure_ascii=False) + "\n")
        written += 1
    return written


async def _write_results(kafka: KafkaConnection, topology: Topology, batch_id: str, out: TextIO,
                         line_format: LineFormat, schema_lookup: codec.SchemaLookup | None,
                         ) -> tuple[ExportDeduper, int]:
    """Write result lines as they are read; hold failures in the deduper (a later result may beat them)."""
    failure_topics = sorted(topology.failed(layer) for layer in FailureLayer)
    deduper = ExportDeduper()
    written = 0
    async with TopicReader(kafka, [topology.results, *failure_topics]) as reader:
        async for chunk in reader.chunks_to_end():
            for record in chunk:
                try:
                    if record.topic == topology.results:
                        result = codec.decode(record.value, InferenceResult, schema_lookup=schema_lookup)
                        if result.batch_id == batch_id and deduper.add_result(result):
                            out.write(json.dumps(line_format.output_line(result), ensure_ascii=False) + "\n")
                            written += 1
                    else:
                        failure = codec.decode(record.value, FailureEvent, schema_lookup=schema_lookup)
                        if failure.request.batch_id == batch_id:
                            deduper.add_failure(failure)
                except codec.CodecError:
                    continue  # a foreign record: not part of any batch's outcome
    return deduper, written
