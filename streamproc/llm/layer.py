"""What every guard wrapper implements: a :class:`~streamproc.llm.client.Caller` told whether the call is the
request's first attempt (the retry budget counts those), wrapping the next one like httpx transports.

:mod:`streamproc.llm.guarded` stacks them; each wrapper does one job before and after the one below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from streamproc.core.events import InferenceRequest

R_co = TypeVar("R_co", covariant=True)


class Layer(Protocol[R_co]):
    """Makes one call through this guard and the ones below; never raises. ``body["model"]`` is a str."""

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> R_co: ...


@dataclass(frozen=True)
class Refused:
    """No call was made: the model's breaker said no at its last check, right before sending (it opened, or
    its probe went out, while this call waited for tokens), and the routing picks a model again; or, with
    ``gave_way``, a rebalance began while the call waited its turn, and the request is parked (design §5.7)."""

    model: str
    gave_way: bool = False
