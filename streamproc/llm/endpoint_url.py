"""The absolute URL of each supported endpoint under the configured base URL, joined once at start-up.

A real URL join (RFC 3986, httpx's), never string concatenation, and checked afterwards to keep the base's
scheme, host, port and path prefix (:func:`streamproc.core.endpoints.joined_url_problem`): a table row that
would leave the base fails the worker at start, not a call. A record's ``url`` only selects a row
(:func:`streamproc.core.endpoints.endpoint_for`); its text never reaches the URL.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from streamproc.core.endpoints import ENDPOINTS, Endpoint, joined_url_problem


def endpoint_url(base_url: str, endpoint: Endpoint) -> httpx.URL:
    """``endpoint.relative`` joined under ``base_url``; ValueError when the base is unusable or the join leaves
    it."""
    return joined_url(base_url, endpoint.relative, f"endpoint {endpoint.url}")


def joined_url(base_url: str, relative: str, what: str) -> httpx.URL:
    """``relative`` joined under ``base_url`` and checked to stay under it; ``what`` names it in the error."""
    base = httpx.URL(base_url)
    if base.scheme not in ("http", "https") or not base.host:
        raise ValueError(f"STREAMPROC_LLM_BASE_URL {base_url!r} is not an http(s) URL with a host")
    if base.query or base.fragment:
        raise ValueError(f"STREAMPROC_LLM_BASE_URL {base_url!r} has a query or a fragment: a join would drop it")
    directory = base.copy_with(path=base.path.rstrip("/") + "/")  # a base path is a directory: /v1 -> /v1/
    joined = directory.join(relative)
    problem = joined_url_problem((directory.scheme, directory.host, directory.port, directory.path),
                                 (joined.scheme, joined.host, joined.port, joined.path, joined.query.decode(),
                                  joined.fragment))
    if problem is not None:
        raise ValueError(f"{what} under STREAMPROC_LLM_BASE_URL {base_url!r}: {problem}")
    return joined


def endpoint_urls(base_url: str) -> Mapping[Endpoint, httpx.URL]:
    """Every supported endpoint's URL under ``base_url``."""
    return {endpoint: endpoint_url(base_url, endpoint) for endpoint in ENDPOINTS.values()}
