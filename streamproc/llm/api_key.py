"""The LLM key, from ``STREAMPROC_LLM_API_KEY`` or the file ``STREAMPROC_LLM_API_KEY_FILE`` names, and the checks
the worker makes before it sends it anywhere: every reader of the key gets it from :func:`llm_api_key`."""

from __future__ import annotations

from streamproc.core.plain_http import plain_http_host
from streamproc.errors import UserFacingError
from streamproc.kafka.secrets import SecretFileError, check_secret, read_secret_file
from streamproc.settings import LLMEndpoint


class InsecureEndpointError(UserFacingError):
    """A key that would cross a network in clear text."""


def llm_api_key(endpoint: LLMEndpoint) -> str | None:
    """The key (checked as any secret is: no whitespace or control characters, never echoed), or None when
    neither variable is set; :class:`SecretFileError` when both are set or the key is refused."""
    if endpoint.api_key is not None and endpoint.api_key_file is not None:
        raise SecretFileError("set STREAMPROC_LLM_API_KEY or STREAMPROC_LLM_API_KEY_FILE, not both")
    if endpoint.api_key_file is not None:
        return read_secret_file(endpoint.api_key_file, "the LLM key (STREAMPROC_LLM_API_KEY_FILE)")
    if endpoint.api_key is not None:
        return check_secret(endpoint.api_key.get_secret_value(), "STREAMPROC_LLM_API_KEY")
    return None


def check_llm_key(endpoint: LLMEndpoint) -> str | None:
    """The key, once it is known to go only where it is safe: a plain ``http://`` base URL to a host that is
    not loopback is refused while a key is set, unless ``STREAMPROC_LLM_ALLOW_INSECURE=1``."""
    key = llm_api_key(endpoint)
    host = plain_http_host(endpoint.base_url) if key is not None and endpoint.base_url else None
    if host is not None and not endpoint.allow_insecure:
        raise InsecureEndpointError(
            f"STREAMPROC_LLM_BASE_URL is plain http:// to {host}, which is not loopback: the key would cross the "
            "network in clear text; use https://, or set STREAMPROC_LLM_ALLOW_INSECURE=1")
    return key
