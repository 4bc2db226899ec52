"""Fleet beats (design §5.8): each worker's demand per model, on the compacted ``<prefix>.fleet`` keyed by worker id.

Small JSON with a version field ``v``, not Avro: like the batch manifests, an operations record no event decoder
reads, and one that an older worker must still read after a newer one added fields (an Avro reader needs the
writer's schema; a JSON reader skips what it does not know). So ``v`` stays 1 while fields are only added
(``spend``: per capped batch and per day, US dollars and tokens, as
``{"batch": {id: [usd, tokens]}, "day": {date: [usd, tokens]}}``; ``limit_told`` per model; ``out``: the
deployments whose breaker is open or half-open, or that are paused, at that worker, and why, as ``{key: reason}``,
core.deployments_out), and a reader that meets a higher ``v`` (a change it cannot read) counts that worker as
wanting everything rather than as absent.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from streamproc.core.deployments_out import bounded
from streamproc.core.fleet_share import BEAT_S, Beat, ModelDemand
from streamproc.core.spend_cap import Scope, Spend

VERSION: Final = 1
SPENT_SUFFIX: Final = "/spend"  # the key of a stopped worker's last spend: its id and this (a worker id holds no '/')
_EVERY_MS = (100, 60_000)  # a beat interval outside this is clamped: staleness is counted in beats
_AMOUNTS = ("waiting_calls", "waiting_tokens", "sent_rpm", "sent_tpm")
_LIMITS = ("limit_rpm", "limit_tpm", "share")


def encode_beat(beat: Beat) -> bytes:
    models = {model: _fields(demand) for model, demand in beat.busiest().items()}
    fields = {"v": VERSION, "every_ms": round(beat.every_s * 1000), "models": models}
    if beat.paused:
        fields["paused"] = True
    if beat.generation:
        fields["generation"] = beat.generation
    if beat.spend:
        spend: dict[str, dict[str, list[float]]] = {}
        for scope, spent in beat.spend.items():
            spend.setdefault(scope.kind, {})[scope.name] = [round(spent.cost_usd, 9), spent.tokens]
        fields["spend"] = spend
    if beat.out:
        fields["out"] = bounded(beat.out)
    return json.dumps(fields, separators=(",", ":")).encode()


def decode_beat(worker: str, data: bytes) -> Beat:
    """The beat of ``worker`` (the record's key); raises ValueError for anything that is not a beat."""
    try:
        fields: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"a fleet beat is JSON: {exc}") from None
    version = fields.get("v") if isinstance(fields, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError("a fleet beat is a JSON object with a version v >= 1")
    every_ms = fields.get("every_ms", BEAT_S * 1000)
    if isinstance(every_ms, bool) or not isinstance(every_ms, int | float) or not math.isfinite(every_ms):
        raise ValueError(f"every_ms must be a number, got {every_ms!r}")
    every_s = min(max(every_ms, _EVERY_MS[0]), _EVERY_MS[1]) / 1000
    if version > VERSION:
        return Beat(worker, every_s=every_s, unreadable=True)
    models, paused, generation = fields.get("models", {}), fields.get("paused", False), fields.get("generation", 0)
    if not isinstance(models, dict):
        raise ValueError("models must be an object of model name -> demand")
    if not isinstance(paused, bool):
        raise ValueError(f"paused must be true or false, got {paused!r}")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation must be an integer >= 0, got {generation!r}")
    return Beat(worker, {str(model): _demand(model, demand) for model, demand in models.items()}, every_s, paused,
                generation, spend=_spend(fields.get("spend", {})), out=_out(fields.get("out", {})))


def _spend(fields: Any) -> dict[Scope, Spend]:
    """The spend per scope; a kind of scope this reader does not know is skipped (it caps nothing here)."""
    if not isinstance(fields, dict) or not all(isinstance(scopes, dict) for scopes in fields.values()):
        raise ValueError("spend must be an object of scope kind -> name -> [usd, tokens]")
    spend = {}
    for kind, scopes in fields.items():
        for name, amounts in scopes.items():
            if not isinstance(amounts, list) or len(amounts) < 2:
                raise ValueError(f"the spend of {kind} {name!r} must be [usd, tokens], got {amounts!r}")
            cost, tokens = (_number(f"{kind} {name}", "spend", amount) for amount in amounts[:2])
            spend[Scope(str(kind), str(name))] = Spend(cost, round(tokens))
    return spend


def _out(fields: Any) -> dict[str, str]:
    if not isinstance(fields, dict) or not all(isinstance(reason, str) for reason in fields.values()):
        raise ValueError("out must be an object of deployment -> reason")
    return bounded({str(key): reason for key, reason in fields.items()})


def _fields(demand: ModelDemand) -> dict[str, float | bool]:
    """The demand's non-zero, known fields (the rest read back as their defaults)."""
    values = {name: getattr(demand, name) for name in (*_AMOUNTS, *_LIMITS)}
    fields: dict[str, float | bool] = {name: round(value, 3) for name, value in values.items() if value}
    if demand.limit_told:
        fields["limit_told"] = True
    return fields


def _demand(model: str, fields: Any) -> ModelDemand:
    if not isinstance(fields, dict):
        raise ValueError(f"the demand of model {model!r} must be an object")
    amounts = [_number(f"model {model}", name, fields.get(name, 0.0)) for name in _AMOUNTS]
    limits = [_number(f"model {model}", name, fields[name]) or None if fields.get(name) is not None else None
              for name in _LIMITS]
    told = fields.get("limit_told", False)
    if not isinstance(told, bool):
        raise ValueError(f"limit_told of model {model!r} must be true or false, got {told!r}")
    return ModelDemand(*amounts, *limits, limit_told=told)


def _number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} of {owner!r} must be a finite number >= 0, got {value!r}")
    return float(value)
