"""Per-model state with a bound: a model name comes from the request topic, so a flood of distinct names must
not grow a worker's memory. The least recently used model's state goes first; a model that is still called
keeps its state (each use makes it the newest).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterator, MutableMapping, ValuesView
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_MODELS = 1024  # per-model states a guard keeps; far over the models a deployment really calls


class LruDict(MutableMapping[K, V], Generic[K, V]):
    """A dict of at most ``maxsize`` keys; reading or writing a key makes it the newest, and a new key over the
    bound drops the oldest (``on_evict`` is told). With ``factory``, reading a missing key makes its value,
    as ``defaultdict`` does; ``get`` and ``in`` never make one."""

    def __init__(self, maxsize: int = MAX_MODELS, factory: Callable[[], V] | None = None,
                 on_evict: Callable[[K, V], None] | None = None) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self._data: OrderedDict[K, V] = OrderedDict()
        self._maxsize = maxsize
        self._factory = factory
        self._on_evict = on_evict

    def __getitem__(self, key: K) -> V:
        try:
            value = self._data[key]
        except KeyError:
            if self._factory is None:
                raise
            value = self[key] = self._factory()
            return value
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._maxsize:
            old_key, old_value = self._data.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def __delitem__(self, key: K) -> None:
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        if key not in self._data:
            return default
        return self[key]

    def items(self) -> ItemsView[K, V]:
        """A view that reads without making anything the newest (iterating may not reorder)."""
        return self._data.items()

    def values(self) -> ValuesView[V]:
        return self._data.values()

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)
