"""The endpoints a request may name, and why any other ``url`` is refused (design §2, "Endpoints").

The request topic is an interface: whoever can write it chooses a record's ``url``, while the worker adds the
API key to every call. So a ``url`` is never joined to the base URL as written: it is looked up in
:data:`ENDPOINTS`, and only the table's own relative path is joined (``llm.endpoint_url``). Everything else
is refused with the reason, before any call: ``submit``, the worker and every replay use this one check, so
they give the same message.

The checks run before the lookup so that the reason names what is wrong (a ``..`` segment, a percent-encoded
byte, a second host) rather than only "not supported". Adding an endpoint is one row in :data:`ENDPOINTS`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

UNSUPPORTED_URL: Final = "unsupported_url"  # the business code of a refused url


@dataclass(frozen=True)
class Endpoint:
    """A supported endpoint: ``url`` as records spell it, ``relative`` the path joined onto the base URL
    (which ends with the API version, ``https://api.openai.com/v1``)."""

    url: str
    relative: str


@dataclass(frozen=True)
class UrlRefused:
    """Why a record's url is not called; ``str()`` is the message submit and the failure event show."""

    url: object
    reason: str

    def __str__(self) -> str:
        return f"unsupported url {_clip(repr(self.url))}: {self.reason}"


ENDPOINTS: Final[Mapping[str, Endpoint]] = {
    "/v1/chat/completions": Endpoint("/v1/chat/completions", "chat/completions"),
}
SUPPORTED: Final = ", ".join(ENDPOINTS)
CHAT_COMPLETIONS: Final = ENDPOINTS["/v1/chat/completions"]  # the simple input form's endpoint

_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def endpoint_for(url: object) -> Endpoint | UrlRefused:
    """The endpoint a record's ``url`` names, or the first reason it is refused."""
    reason = _refusal(url)
    if reason is not None:
        return UrlRefused(url, reason)
    assert isinstance(url, str)
    return ENDPOINTS[url]


def _refusal(url: object) -> str | None:
    if not isinstance(url, str):
        return f"a url is a string, not {type(url).__name__}"
    if not url:
        return f"the url is empty (supported: {SUPPORTED})"
    for position, char in enumerate(url):
        if unicodedata.category(char).startswith("C"):  # controls (NUL, newline, DEL, C1), format, surrogates
            return f"control character U+{ord(char):04X} at position {position}"
        if not char.isascii():  # lookalike slashes and dots (U+2215, U+FF0F, U+2024) included
            return f"non-ASCII character {char!r} (U+{ord(char):04X}) at position {position}: endpoint paths are ASCII"
    if "\\" in url:
        return f"a backslash at position {url.index(chr(92))}: some parsers read it as a slash"
    if "%" in url:
        return f"percent-encoding at position {url.index('%')}: endpoint paths are written plainly"
    if url.startswith("//"):
        return "a protocol-relative url names a host: a record names a path, the worker's base URL the host"
    if _SCHEME.match(url):
        return "an absolute url names a host: a record names a path, the worker's base URL the host"
    if "?" in url:
        return "a query string: an endpoint path has none"
    if "#" in url:
        return "a fragment: an endpoint path has none"
    if any(segment in (".", "..") for segment in url.split("/")):
        return "a dot segment ('.' or '..'): endpoint paths are written out whole"
    if not url.startswith("/"):
        return f"a url is an absolute path, starting with / (supported: {SUPPORTED})"
    if url not in ENDPOINTS:
        return f"not a supported endpoint (supported: {SUPPORTED})"
    return None


def joined_url_problem(base: tuple[str, str, int | None, str], joined: tuple[str, str, int | None, str, str, str],
                       ) -> str | None:
    """Why a joined URL is not under its base, or None: the same scheme, host and port, a path under the base's
    path, no query and no fragment. ``base`` is (scheme, host, port, path), ``joined`` adds query and fragment."""
    scheme, host, port, path = base
    j_scheme, j_host, j_port, j_path, j_query, j_fragment = joined
    if (j_scheme, j_host, j_port) != (scheme, host, port):
        return f"the joined URL points at {_origin(j_scheme, j_host, j_port)}, not {_origin(scheme, host, port)}"
    prefix = path if path.endswith("/") else path + "/"
    if not j_path.startswith(prefix) or j_path == prefix:
        return f"the joined path {j_path!r} is not under the base's path {prefix!r}"
    if j_query or j_fragment:
        return "the joined URL has a query or a fragment"
    return None


def _origin(scheme: str, host: str, port: int | None) -> str:
    return f"{scheme}://{host}" if port is None else f"{scheme}://{host}:{port}"


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
