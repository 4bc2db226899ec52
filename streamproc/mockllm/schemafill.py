"""A small generator of JSON values that satisfy ordinary JSON Schemas, deterministically from a seed text.

It covers what structured-output schemas use: ``type`` (also lists), ``enum``, ``const``, ``properties`` /
``required``, ``items`` / ``prefixItems`` / ``minItems`` / ``maxItems``, numeric bounds, string lengths and
common ``format``s, local ``$ref``s (``#/$defs/...``, ``#/definitions/...``), ``anyOf`` / ``oneOf`` (first
usable branch) and ``allOf`` (merged). A ``pattern`` cannot be honoured in general: it is ignored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

_MAX_DEPTH = 12
_OPTIONAL_DEPTH = 3
_TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")
_FORMATS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "mock@example.com",
    "uri": "https://example.com/mock",
    "url": "https://example.com/mock",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


class SchemaFiller:
    """Fill one schema; ``seed`` (e.g. the request fingerprint) varies the values and shows in strings."""

    def __init__(self, root: Mapping[str, Any], seed: str) -> None:
        self.root = root
        self.seed = seed

    def value(self) -> Any:
        return self._fill(self.root, "value", 0)

    def _pick(self, path: str, count: int) -> int:
        """A stable index in ``range(count)`` for a place in the schema."""
        digest = hashlib.blake2b(f"{self.seed}/{path}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") % count

    def _resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < _MAX_DEPTH:
            ref: str = schema["$ref"]
            target: Any = self.root
            if ref.startswith("#"):
                for part in ref.lstrip("#").strip("/").split("/"):
                    if not part:
                        continue
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target.get(part) if isinstance(target, Mapping) else None
            else:
                target = None
            if not isinstance(target, Mapping):
                return {}
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest}
            seen += 1
        return schema

    def _fill(self, schema: Any, path: str, depth: int) -> Any:
        if schema is True or not isinstance(schema, Mapping):
            return self._string({}, path)
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            options = schema["enum"]
            return options[self._pick(path, len(options))]
        if isinstance(schema.get("allOf"), list):
            merged = _merge_all_of(self, schema)
            if merged is not schema:
                return self._fill(merged, path, depth + 1)
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                usable = [b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")]
                branch = (usable or branches)[0]
                rest = {k: v for k, v in schema.items() if k != key}
                target = {**rest, **branch} if isinstance(branch, Mapping) else rest
                return self._fill(target, path, depth + 1)
        kind = _schema_type(schema)
        if depth >= _MAX_DEPTH:
            return None if kind in ("null", None) else _minimal(kind)
        if kind == "object":
            return self._object(schema, path, depth)
        if kind == "array":
            return self._array(schema, path, depth)
        if kind == "integer":
            return self._integer(schema, path)
        if kind == "number":
            return self._number(schema, path)
        if kind == "boolean":
            return self._pick(path, 2) == 1
        if kind == "null":
            return None
        return self._string(schema, path)

    def _object(self, schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        # Optional properties are filled near the top only, so recursive schemas end.
        optional = list(properties) if depth < _OPTIONAL_DEPTH else [p for p in properties if p in required]
        names = optional + [r for r in required if r not in optional]
        out = {name: self._fill(properties.get(name, {}), f"{path}.{name}", depth + 1) for name in names}
        minimum = schema.get("minProperties")
        extra = schema.get("additionalProperties", True)
        if isinstance(minimum, int) and len(out) < minimum and extra is not False:
            for i in range(len(out), minimum):
                out[f"extra_{i}"] = self._fill(extra if isinstance(extra, Mapping) else {}, f"{path}.{i}", depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], path: str, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", {})
        low = schema.get("minItems", 0) if isinstance(schema.get("minItems"), int) else 0
        high = schema.get("maxItems") if isinstance(schema.get("maxItems"), int) else None
        count = max(low, len(prefix), 1 + self._pick(path, 3))
        if high is not None:
            count = max(min(count, high), min(low, high))
        if items is False:
            count = min(count, len(prefix))
        values: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            values.append(self._fill(sub, f"{path}[{i}]", depth + 1))
        if schema.get("uniqueItems") is True:
            values = _dedupe(values)
        return values

    def _integer(self, schema: Mapping[str, Any], path: str) -> int:
        low, high = _bounds(schema)
        lo = int(_ceil(low)) if low is not None else None
        hi = int(_floor(high)) if high is not None else None
        if lo is None and hi is None:
            value = self._pick(path, 100)
        elif lo is None:
            value = hi if hi is not None else 0
        elif hi is None:
            value = lo + self._pick(path, 10)
        else:
            value = lo + self._pick(path, max(1, hi - lo + 1)) if hi >= lo else lo
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            value = (value // step) * step
            if lo is not None and value < lo:
                value += step
        return value

    def _number(self, schema: Mapping[str, Any], path: str) -> float:
        low, high = _bounds(schema)
        fraction = self._pick(path, 1000) / 1000
        if low is None and high is None:
            return round(fraction * 100, 3)
        if low is None:
            return float(high) - 1.0 if high is not None else 0.0
        if high is None:
            return float(low) + 1.0
        value = low + (high - low) * fraction
        return float(min(max(value, low), high))

    def _string(self, schema: Mapping[str, Any], path: str) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        name = path.rsplit(".", 1)[-1].replace("[", "-").replace("]", "") or "value"
        text = f"{name}-{self.seed}"
        low = schema.get("minLength")
        high = schema.get("maxLength")
        if isinstance(low, int) and len(text) < low:
            text = (text + "-" + "x" * low)[:low]
        if isinstance(high, int) and len(text) > high:
            text = text[:high]
        return text


def _schema_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [k for k in kind if isinstance(k, str)]
        non_null = [k for k in options if k != "null"]
        ordered = sorted(non_null or options, key=lambda k: _TYPE_ORDER.index(k) if k in _TYPE_ORDER else 99)
        return ordered[0] if ordered else None
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return None


def _minimal(kind: str | None) -> Any:
    return {"object": {}, "array": [], "integer": 0, "number": 0.0, "boolean": False}.get(kind or "", "")


def _merge_all_of(filler: SchemaFiller, schema: Mapping[str, Any]) -> Mapping[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties: dict[str, Any] = dict(merged.get("properties", {}) or {})
    required: list[str] = list(merged.get("required", []) or [])
    for part in schema["allOf"]:
        if not isinstance(part, Mapping):
            continue
        part = filler._resolve(part)
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                properties.update(value)
            elif key == "required" and isinstance(value, list):
                required.extend(r for r in value if r not in required)
            else:
                merged.setdefault(key, value)
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, float | None]:
    def number(key: str) -> float | None:
        value = schema.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    low, high = number("minimum"), number("maximum")
    ex_low, ex_high = number("exclusiveMinimum"), number("exclusiveMaximum")
    if ex_low is not None:
        low = max(low, ex_low + 1e-3) if low is not None else ex_low + 1e-3
    if ex_high is not None:
        high = min(high, ex_high - 1e-3) if high is not None else ex_high - 1e-3
    return low, high


def _ceil(value: float) -> float:
    return float(-(-value // 1))


def _floor(value: float) -> float:
    return float(value // 1)


def _dedupe(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def fill_schema(schema: Mapping[str, Any], seed: str) -> Any:
    """A value that validates against ``schema``, the same for the same (schema, seed)."""
    return SchemaFiller(schema, seed).value()
