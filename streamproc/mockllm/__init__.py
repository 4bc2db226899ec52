"""The fault-injecting OpenAI-compatible LLM server (``streamproc mock-llm``).

It answers like real providers, fails in every way they fail (transport, service, semantic, business),
enforces real rate limits and counts what it received, so failure handling can be rehearsed and tested.
Start it with ``running_mock_llm`` (in the event loop), ``MockLLMThread`` or ``MockLLMProcess``.

The names below are loaded on first use: ``streamproc --help`` imports the ``mock-llm`` command, and must not
load the server (aiohttp) with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamproc.mockllm.content_key import request_fingerprint, request_key
    from streamproc.mockllm.injected_faults import FaultKind
    from streamproc.mockllm.profiles import BUILTIN_PROFILES, Overrides, Profile, load_profile
    from streamproc.mockllm.runner import MockLLMHandle, MockLLMProcess, MockLLMThread, running_mock_llm

_MODULE_OF = {
    "BUILTIN_PROFILES": "profiles",
    "FaultKind": "injected_faults",
    "MockLLMHandle": "runner",
    "MockLLMProcess": "runner",
    "MockLLMThread": "runner",
    "Overrides": "profiles",
    "Profile": "profiles",
    "load_profile": "profiles",
    "request_fingerprint": "content_key",
    "request_key": "content_key",
    "running_mock_llm": "runner",
}

__all__ = [
    "BUILTIN_PROFILES",
    "FaultKind",
    "MockLLMHandle",
    "MockLLMProcess",
    "MockLLMThread",
    "Overrides",
    "Profile",
    "load_profile",
    "request_fingerprint",
    "request_key",
    "running_mock_llm",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
