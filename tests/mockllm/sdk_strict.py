"""Strict parsing of the mock's answers with the official SDKs' own pydantic models.

The SDKs' models accept unknown fields (kept as extras) and their ``construct`` path skips validation; here
the raw JSON goes through ``model_validate`` (a missing or mistyped field fails) and then every nested model
is checked for extras (a field the SDK does not know fails), so the mock cannot drift from the real shapes.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

Model = TypeVar("Model", bound=pydantic.BaseModel)


def strict(model: type[Model], raw: Any) -> Model:
    parsed = model.model_validate(raw)
    _no_extras(parsed, model.__name__)
    return parsed


def _no_extras(value: Any, where: str) -> None:
    if isinstance(value, pydantic.BaseModel):
        extra = value.model_extra or {}
        assert not extra, f"{where}: fields the SDK does not know: {sorted(extra)}"
        for name in type(value).model_fields:
            _no_extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _no_extras(item, f"{where}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_extras(item, f"{where}.{key}")
