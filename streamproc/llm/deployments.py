"""The bottom of the guard stack when a model has several deployments: the call goes to its deployment's client.

The guards above name a deployment by its key (:class:`streamproc.core.model_list.Deployment`), so each one has
its own breaker, rate limits and adaptive timeout; here that key picks the deployment's :class:`LLMClient` (its
own connections and key), and the body names the model as the deployment knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.long_requests import NO_POOL, LongRequests
from streamproc.core.model_list import ANY_MODEL, ModelList
from streamproc.llm.client import Caller, CallResult, LLMClient
from streamproc.llm.model_list_file import deployment_endpoint
from streamproc.settings import LLMEndpoint


class DeploymentCaller:
    """A :class:`Caller` whose ``body["model"]`` is a deployment key; the answer keeps that key as its model."""

    def __init__(self, models: ModelList, clients: Mapping[str, Caller]) -> None:
        self._models = models
        self._clients = clients  # deployment key (the single endpoint's is ANY_MODEL) -> its client

    @classmethod
    def connect(cls, models: ModelList, default: LLMEndpoint, *, connections: int,
                hedge_ratio: float, long_requests: LongRequests = NO_POOL) -> DeploymentCaller:
        """A client per deployment, each with ``connections`` connections (its own pool); ``long_requests`` says
        which calls are timed apart as long."""
        clients = {deployment.key: LLMClient(deployment_endpoint(deployment, default), connections=connections,
                                             hedge_ratio=hedge_ratio, long_requests=long_requests)
                   for deployment in models.deployments}
        return cls(models, clients)

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        key = body.get("model")
        deployment = self._models.by_key(key) if isinstance(key, str) else None
        if deployment is None:  # malformed bodies (no model) go to the first deployment, which says why
            first = self._models.deployments[0]
            return await self._clients[first.key].call(request, body)
        client = self._clients.get(deployment.key) or self._clients[ANY_MODEL]  # the single endpoint's serves any
        sent = deployment.model
        called = await client.call(request, body if sent == key else {**body, "model": sent})
        return replace(called, model=deployment.key)

    @property
    def hedged(self) -> int:
        """Hedges sent by every deployment's client."""
        return sum(client.hedged for client in self._clients.values() if isinstance(client, LLMClient))

    async def aclose(self) -> None:
        for client in self._clients.values():
            if isinstance(client, LLMClient):
                await client.aclose()
