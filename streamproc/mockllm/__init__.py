"""The fault-injecting OpenAI-compatible LLM server (``streamproc mock-llm``).

It answers like real providers, fails in every way they fail (transport, service, semantic, business),
enforces real rate limits and counts what it received, so failure handling can be rehearsed and tested.
Start it with ``running_mock_llm`` (in the event loop), ``MockLLMThread`` or ``MockLLMProcess``.
"""

from streamproc.mockllm.content_key import request_fingerprint, request_key
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.profiles import BUILTIN_PROFILES, Overrides, Profile, load_profile
from streamproc.mockllm.runner import MockLLMHandle, MockLLMProcess, MockLLMThread, running_mock_llm

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
