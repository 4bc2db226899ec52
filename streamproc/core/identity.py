"""A request's identity is (batch, custom_id): the request id every topic and the state table are keyed by.

OpenAI Batch users number their requests ``request-1``, ``request-2``, … in every batch, so a custom_id alone
names a different request in each batch. ``submit`` therefore keys a request by ``<batch_id>/<custom_id>``
(design §4): the same custom_id in another batch is another request, while a duplicate inside one batch, a
redelivery or a replay still meets the state of the same id. The worker needs no notion of batches for this.

Request ids written before ids were scoped (the custom_id itself), and ids of other producers, stay valid:
:func:`custom_id_of` gives them back unchanged, so their states, results and failures read as before.
"""

from __future__ import annotations

from typing import Final

SEPARATOR: Final = "/"


def request_id_for(batch_id: str, custom_id: str) -> str:
    """The request id ``submit`` gives the custom_id of a batch (see :func:`batch_id_problem`)."""
    return f"{batch_id}{SEPARATOR}{custom_id}"


def custom_id_of(request_id: str, batch_id: str | None) -> str:
    """The user's custom_id of a request: its id without the batch scope.

    An id without its batch's scope (written before ids were scoped, or by another producer) is its own
    custom_id.
    """
    if batch_id is not None:
        scope = f"{batch_id}{SEPARATOR}"
        if request_id.startswith(scope) and len(request_id) > len(scope):
            return request_id[len(scope):]
    return request_id


def batch_id_problem(batch_id: str) -> str | None:
    """Why a new batch may not be named ``batch_id``, or None.

    A separator inside the batch id would make (``a/b``, ``c``) and (``a``, ``b/c``) one request id.
    """
    if not batch_id.strip():
        return "a batch id must not be empty"
    if SEPARATOR in batch_id:
        return f"a batch id must not contain {SEPARATOR!r} (it separates the batch from the custom_id in request ids)"
    return None
