"""A client of a schema registry's Confluent API: our Avro schemas registered under the topic-name strategy
(subject ``<topic>-value``), their ids, and writer schemas looked up by id.

Any registry with the Confluent REST API works (Confluent Schema Registry; Apicurio under
``/apis/ccompat/v7``): the URL given is the API's base. Ids never change meaning, so each answer is cached for
the life of the process: one request per id, whatever the number of records.

A lookup is a blocking HTTP call of up to its timeout, so the worker never makes one on its event loop: it decodes
with :meth:`SchemaRegistry.known_schema` (the cache only) after :meth:`SchemaRegistry.fetch_ahead` has fetched an
unknown id in a thread. A loop blocked for seconds would miss the consumer's heartbeats and lose its partitions.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from streamproc import codec
from streamproc.codec import SchemaLookup, writing_schema
from streamproc.codec.records import Event
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.errors import UserFacingError
from streamproc.settings import RegistryAccess

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_NOTHING_TO_CHECK = {40401, 40402}  # subject not found (Confluent), its latest version not found (Apicurio)


SchemaPrefetch = Callable[[bytes | None], Awaitable[None]]
"""Fetches, off the event loop, the schema a Confluent-framed payload names unless it is known (see
:meth:`SchemaRegistry.fetch_ahead`); any other payload needs nothing."""


async def nothing_to_fetch(data: bytes | None) -> None:
    """The :data:`SchemaPrefetch` of a reader without a registry."""


class SchemaNotFetched(LookupError):
    """A schema id not in the cache: it was not fetched ahead, or its fetch failed (the message says why)."""


class SchemaRegistryRefused(UserFacingError):
    """The registry is unreachable, refuses our credentials, or says a schema is incompatible: the worker
    does not start (one line, exit 3)."""


def subject(topic: str) -> str:
    """The topic-name strategy's subject of a topic's record values."""
    return f"{topic}-value"


def topic_schemas(topology: Topology) -> dict[str, type[Event]]:
    """The Avro topics whose records are registered: requests (with the retry tiers the worker writes back), results
    and the failure topics."""
    return {
        **{topic: InferenceRequest for topic in topology.inputs},
        topology.results: InferenceResult,
        **{topology.failed(layer): FailureEvent for layer in FailureLayer},
    }


def _trust(access: RegistryAccess) -> ssl.SSLContext | bool:
    """What an https registry's certificate is checked against: the CA file given, else the system's store."""
    if access.ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(access.ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise SchemaRegistryRefused(f"STREAMPROC_SCHEMA_REGISTRY_CA_FILE {access.ca_file}: not a readable PEM file "
                                    f"of CA certificates ({exc})") from exc


class SchemaRegistry:
    """Registers schemas and resolves ids; one HTTP client, and every id's schema cached."""

    def __init__(self, access: RegistryAccess, timeout_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        auth = ((access.username, access.password.get_secret_value() if access.password else "")
                if access.username else None)
        self._url = access.url.rstrip("/")
        self._client = httpx.Client(base_url=self._url, auth=auth, timeout=timeout_s, verify=_trust(access),
                                    headers={"Accept": _CONTENT_TYPE}, transport=transport)
        self._schemas: dict[int, str] = {}
        self._fetch_failures: dict[int, str] = {}  # id -> why its last fetch ahead failed (tried again next time)
        self._fetching: dict[int, asyncio.Future[None]] = {}  # one fetch an id, shared by the records awaiting it

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> httpx.Response:
        try:
            return self._client.request(method, path, content=None if body is None else json.dumps(body),
                                        headers={"Content-Type": _CONTENT_TYPE} if body is not None else None)
        except httpx.HTTPError as exc:
            raise SchemaRegistryRefused(f"schema registry {self._url} unreachable: {exc!r}; check "
                                        "STREAMPROC_SCHEMA_REGISTRY_URL") from exc

    def _answer(self, response: httpx.Response, what: str) -> dict[str, Any]:
        if response.status_code in (401, 403):
            raise SchemaRegistryRefused(f"schema registry {self._url} refused the credentials ({response.status_code}) "
                                        f"on {what}: check STREAMPROC_SCHEMA_REGISTRY_USERNAME/_PASSWORD")
        if response.is_error:
            raise SchemaRegistryRefused(f"schema registry {self._url} answered {response.status_code} on {what}: "
                                        f"{response.text[:300]}")
        answer = response.json()
        if not isinstance(answer, dict):
            raise SchemaRegistryRefused(f"schema registry {self._url} answered {answer!r:.200} on {what}")
        return answer

    def is_compatible(self, subject_name: str, schema: Mapping[str, Any]) -> bool:
        """Whether the registry accepts ``schema`` as the next version of ``subject_name`` (a new subject: yes)."""
        response = self._call("POST", f"/compatibility/subjects/{quote(subject_name, safe='')}/versions/latest",
                               {"schema": json.dumps(schema), "schemaType": "AVRO"})
        if response.status_code == 404 and response.json().get("error_code") in _NOTHING_TO_CHECK:
            return True
        return bool(self._answer(response, f"the compatibility check of {subject_name}").get("is_compatible"))

    def register(self, subject_name: str, schema: Mapping[str, Any]) -> int:
        """The id of ``schema`` under ``subject_name``, registered if new (registering the same schema again
        returns the same id)."""
        text = json.dumps(schema)
        answer = self._answer(self._call("POST", f"/subjects/{quote(subject_name, safe='')}/versions",
                                         {"schema": text, "schemaType": "AVRO"}), f"registering {subject_name}")
        schema_id = int(answer["id"])
        self._schemas[schema_id] = text
        return schema_id

    def schema(self, schema_id: int) -> str:
        """The writer schema (JSON text) of ``schema_id``: a :data:`streamproc.codec.SchemaLookup`."""
        cached = self._schemas.get(schema_id)
        if cached is None:
            answer = self._answer(self._call("GET", f"/schemas/ids/{schema_id}"), f"schema id {schema_id}")
            cached = self._schemas[schema_id] = str(answer["schema"])
        return cached

    def known_schema(self, schema_id: int) -> str:
        """The cached writer schema of ``schema_id``, never a request: the lookup the worker decodes with on its
        event loop, after :meth:`fetch_ahead`."""
        cached = self._schemas.get(schema_id)
        if cached is None:
            raise SchemaNotFetched(self._fetch_failures.get(schema_id, f"schema id {schema_id} was not fetched"))
        return cached

    async def fetch_ahead(self, data: bytes | None) -> None:
        """Fetch, in a thread, the schema that the Confluent-framed ``data`` names, unless it is cached; records
        naming the same unknown id share one fetch. Never raises: a failure is remembered for
        :meth:`known_schema` to report, and the next record naming the id tries again."""
        schema_id = codec.confluent_schema_id(data)
        if schema_id is None or schema_id in self._schemas:
            return
        fetching = self._fetching.get(schema_id)
        if fetching is None:
            fetching = self._fetching[schema_id] = asyncio.ensure_future(self._fetch(schema_id))
        await asyncio.shield(fetching)  # a cancelled record leaves the fetch to the others awaiting it

    async def _fetch(self, schema_id: int) -> None:
        try:
            await asyncio.to_thread(self.schema, schema_id)
            self._fetch_failures.pop(schema_id, None)
        except Exception as exc:
            self._fetch_failures[schema_id] = str(exc)
        finally:
            del self._fetching[schema_id]

    def register_topics(self, schemas: Mapping[str, type[Event]]) -> dict[str, int]:
        """Check every topic's writing schema (the current one, or an older release's during an upgrade) is
        compatible, then register them; topic -> schema id. An incompatible one refuses before anything is
        registered."""
        current = {topic: writing_schema(record_type).schema for topic, record_type in schemas.items()}
        refused = [topic for topic, schema in current.items() if not self.is_compatible(subject(topic), schema)]
        if refused:
            raise SchemaRegistryRefused(
                f"schema registry {self._url}: our schema is incompatible with the latest version of "
                f"{', '.join(subject(topic) for topic in refused)} under the registry's compatibility rule")
        return {topic: self.register(subject(topic), schema) for topic, schema in current.items()}


@dataclass(frozen=True)
class SchemaReader:
    """How a reader on an event loop decodes records that may be Confluent-framed: :attr:`fetch_ahead` of the
    payload first (off the loop), then the codec with :attr:`lookup`, the cache it filled. The default has no
    registry: no lookup, nothing to fetch."""

    lookup: SchemaLookup | None = None
    fetch_ahead: SchemaPrefetch = nothing_to_fetch


NO_REGISTRY = SchemaReader()


@dataclass(frozen=True)
class RegisteredSchemas:
    """What the worker writes and reads by once its schemas are registered: each event type's schema id, and how
    to read any id. Every topic of a type holds the same schema, so any of their ids names it."""

    ids: Mapping[type[Event], int]
    reader: SchemaReader

    def encode(self, record: Event) -> bytes:
        """``record`` in the Confluent wire format, under its type's registered id."""
        return codec.encode_confluent(record, self.ids[type(record)])


def register_schemas(access: RegistryAccess, topology: Topology) -> RegisteredSchemas:
    """Check and register every Avro topic's schema (:meth:`SchemaRegistry.register_topics`)."""
    registry = SchemaRegistry(access)
    schemas = topic_schemas(topology)
    ids = registry.register_topics(schemas)
    return RegisteredSchemas({record_type: ids[topic] for topic, record_type in schemas.items()},
                             SchemaReader(registry.known_schema, registry.fetch_ahead))


def request_encoder(access: RegistryAccess | None, topology: Topology) -> Callable[[InferenceRequest], bytes]:
    """How a producer of requests (``submit``) writes them: with a registry, in the Confluent wire format under the
    id of the request topic's subject, checked and registered first (an incompatible schema refuses); else in
    single-object encoding."""
    if access is None:
        return codec.encode
    registry = SchemaRegistry(access)
    try:
        schema_id = registry.register_topics({topology.requests: InferenceRequest})[topology.requests]
    finally:
        registry.close()
    return functools.partial(codec.encode_confluent, schema_id=schema_id)


def reader_lookup(access: RegistryAccess | None) -> SchemaLookup | None:
    """The lookup a reader of our topics decodes with: the registry's when one is configured."""
    return None if access is None else SchemaRegistry(access).schema
