"""The measured batch: OpenAI Batch API lines like ``scripts/demo`` writes, half of them asking for a schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOPICS = ("a delayed parcel", "a broken charger", "fast delivery", "a rude agent", "a refund that worked")
LABEL_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "label", "schema": {
    "type": "object", "required": ["label", "confidence"],
    "properties": {"label": {"type": "string", "enum": ["positive", "neutral", "negative"]},
                   "confidence": {"type": "number"}}}}}


def ticket_body(i: int, *, note: str = "") -> dict[str, Any]:
    """The chat body of ticket ``i``; odd tickets ask for the label schema. ``note`` varies the text."""
    body: dict[str, Any] = {
        "model": "mock-small", "max_tokens": 200,
        "messages": [{"role": "system", "content": "Classify customer feedback."},
                     {"role": "user", "content": f"Ticket {i}: the customer writes about {TOPICS[i % 5]}.{note}"}]}
    if i % 2:
        body["response_format"] = LABEL_FORMAT
    return body


def batch_line(custom_id: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def ticket_id(i: int) -> str:
    return f"ticket-{i}"


def write_batch(path: Path, count: int, first: int = 0) -> dict[str, str]:
    """Write ``count`` tickets from ticket ``first`` on as batch JSONL; returns each custom_id's body as JSON, in file
    order (the tally tells the batch's own records from a duplicate by it)."""
    bodies = {ticket_id(i): ticket_body(i) for i in range(first, first + count)}
    with open(path, "w", encoding="utf-8") as out:
        for custom_id, body in bodies.items():
            out.write(batch_line(custom_id, body) + "\n")
    return {custom_id: json.dumps(body) for custom_id, body in bodies.items()}
