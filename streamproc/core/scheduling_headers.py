"""The headers a request record is scheduled by: the worker's agents read them without decoding the value."""

from __future__ import annotations

import json

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.long_requests import size_header
from streamproc.core.tenancy import Tenancy, tenancy_headers


def scheduling_headers(request: InferenceRequest) -> tuple[tuple[str, bytes], ...]:
    """Its tenancy's ``x-tenant``/``x-priority`` (when not the default) and its estimated size (a body that is no
    JSON object has none: the handler refuses it anyway)."""
    tenancy = tenancy_headers(Tenancy(request.tenant, request.priority))
    try:
        body = json.loads(request.body_json)
    except ValueError:
        return tenancy
    return (*tenancy, size_header(body)) if isinstance(body, dict) else tenancy
