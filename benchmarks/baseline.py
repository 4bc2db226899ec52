"""The CPU-bound baseline: a bare asyncio loop, aiokafka consumer -> httpx POST -> aiokafka producer.

No faust, no state table, no ordered acks, no retries: what the pipeline's per-record work costs without the
framework. It uses the worker's httpx pools (small ones, the least busy one per call; httpx on httpcore whatever the
worker's ``STREAMPROC_LLM_HTTP``), decodes
the same Avro requests and writes the same Avro results (so the benchmark reads both runs with one reader),
keeps at most ``--in-flight`` calls running, and awaits every send (acks=all) before the record counts as
done. It exits once ``--expected`` records were consumed and handled.

Run by ``benchmarks.pipeline`` as ``python -m benchmarks.baseline ...``; not meant to be used on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamproc import codec
from streamproc.core.endpoints import CHAT_COMPLETIONS
from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.llm.endpoint_url import endpoint_url
from streamproc.llm.http_stacks import HttpxPools
from streamproc.settings import Settings


async def run(bootstrap: str, topic: str, group: str, results_topic: str, llm_url: str, in_flight: int,
              expected: int) -> int:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    # the worker's httpx pools (streamproc.llm.http_stacks): one httpx pool of 256 connections costs ~10 ms of
    # CPU per call in httpcore, which would measure httpcore, not the pipeline
    pools = HttpxPools(Settings(llm_base_url=llm_url, llm_timeout_s=60.0).llm_endpoint, in_flight,
                       {"user-agent": "streamproc-bench-baseline"})
    chat_url = endpoint_url(llm_url, CHAT_COMPLETIONS)  # the benchmark's records are all chat completions
    slots = asyncio.Semaphore(in_flight)
    tasks: set[asyncio.Task[None]] = set()
    errors = 0

    async def handle(key: bytes | None, value: bytes | None) -> None:
        nonlocal errors
        try:
            request = codec.decode(value, InferenceRequest)
            body: Any = json.loads(request.body_json)
            started = time.monotonic()
            response = await pools.post(chat_url, body,
                                        {"x-request-id": request.request_id}, 60.0)
            latency_ms = round((time.monotonic() - started) * 1000)
            if response.status != 200:
                errors += 1
                return
            answer = json.loads(response.content)
            result = InferenceResult(
                request_id=request.request_id, batch_id=request.batch_id, model=str(answer.get("model", "")),
                response_json=response.content.decode(), content=str(answer["choices"][0]["message"]["content"]),
                attempts=1, latency_ms=latency_ms, completed_ms=time.time_ns() // 1_000_000, input_hash="",
            )
            delivery = await producer.send(results_topic, key=key, value=codec.encode(result))
            await delivery
        except Exception as exc:  # a benchmark counts errors, it does not retry them
            errors += 1
            print(f"baseline: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            slots.release()

    await producer.start()
    await consumer.start()
    consumed = 0
    try:
        while consumed < expected:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for message in messages:
                    await slots.acquire()
                    task = asyncio.create_task(handle(message.key, message.value))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    consumed += 1
        while tasks:
            await asyncio.gather(*list(tasks))
        await producer.flush()
    finally:
        await consumer.stop()
        await producer.stop()
        await pools.aclose()
    print(json.dumps({"consumed": consumed, "errors": errors}), flush=True)
    return 0 if errors == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--results-topic", required=True)
    parser.add_argument("--llm-url", required=True)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--expected", type=int, required=True)
    args = parser.parse_args()
    sys.exit(asyncio.run(run(args.bootstrap, args.topic, args.group, args.results_topic, args.llm_url,
                             args.in_flight, args.expected)))


if __name__ == "__main__":
    main()
