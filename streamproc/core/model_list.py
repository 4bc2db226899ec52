"""The model list: which deployments serve each model a request may name (LiteLLM's ``model_list``, as written).

A team that spreads a model over several deployments (two regions, two replicas, a self-hosted standby)
already has this file for LiteLLM's router; the worker reads it as it is (``STREAMPROC_MODELS_FILE``). Only
what this project does is accepted: OpenAI-compatible providers, the keys below; any other key is refused by
name, since a setting silently ignored (a ``max_parallel_requests``, an Azure ``api_version``) would promise
what the worker does not do. Without the file, the one endpoint of ``STREAMPROC_LLM_BASE_URL`` is a list of
one deployment serving every model (:func:`single_endpoint`).

Pure: the caller loads the YAML and reads the keys the entries name (an environment variable, a file).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from streamproc.core.model_names import model_name_problem

ANY_MODEL: Final = "*"  # the model name of the single endpoint's deployment: it serves whatever is asked
ENV_PREFIX: Final = "os.environ/"  # LiteLLM's way of naming a key kept in an environment variable
# providers whose API this project speaks (an OpenAI-compatible /chat/completions under api_base); the prefix
# is LiteLLM's routing hint and is not sent
OPENAI_COMPATIBLE: Final = ("openai/", "hosted_vllm/", "text-completion-openai/")
ENTRY_KEYS: Final = frozenset({"model_name", "litellm_params"})
PARAM_KEYS: Final = frozenset({"model", "api_base", "api_key", "api_key_file", "rpm", "tpm", "timeout", "weight"})


class ModelListProblem(ValueError):
    """Why the model list is refused; ``str()`` is the one line the worker stops with."""


@dataclass(frozen=True)
class ApiKeySource:
    """Where a deployment's key is: written out, in an environment variable, or in a file (one of the three)."""

    value: str | None = None
    env: str | None = None
    file: str | None = None


@dataclass(frozen=True)
class Deployment:
    """One place that serves a model: its own base URL, key, limits and timeout. ``key`` names it to the guards
    (breaker, rate limits, timeouts), in metrics and in the log: ``<model_name>@<n>``, n counting from 1 in the
    order of the file; the single endpoint's deployment is named by the model each call asks for."""

    key: str
    model_name: str  # what requests name
    model: str  # what is sent to the provider in the body
    api_base: str | None  # None: STREAMPROC_LLM_BASE_URL
    api_key: ApiKeySource | None  # None: STREAMPROC_LLM_API_KEY(_FILE)
    rpm: float | None = None
    tpm: float | None = None
    timeout_s: float | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class ModelList:
    """The deployments of each model, in the file's order."""

    deployments: tuple[Deployment, ...]

    @property
    def serves_any_model(self) -> bool:
        """The single endpoint: every model name goes to it, named as asked."""
        return any(deployment.model_name == ANY_MODEL for deployment in self.deployments)

    def models(self) -> tuple[str, ...]:
        """The model names the list serves (none for the single endpoint, which serves any)."""
        return tuple(dict.fromkeys(d.model_name for d in self.deployments if d.model_name != ANY_MODEL))

    def keys(self) -> tuple[str, ...]:
        """The deployments' keys (none for the single endpoint, whose deployment is named by each model asked)."""
        return tuple(d.key for d in self.deployments if d.model_name != ANY_MODEL)

    def entry_of(self, key: str) -> str:
        """The key of the list's entry that takes the calls the guards name ``key``: the key itself when listed,
        the single endpoint's (:data:`ANY_MODEL`) otherwise. Calls to one entry share its in-flight limit."""
        return key if key in self.keys() else ANY_MODEL

    def serves(self, model: str) -> bool:
        return self.serves_any_model or model in self.models()

    def of(self, model: str) -> tuple[Deployment, ...]:
        """The deployments serving ``model``; the single endpoint's, named after the model, when it serves any."""
        listed = tuple(d for d in self.deployments if d.model_name == model)
        if listed:
            return listed
        return tuple(_named_after(d, model) for d in self.deployments if d.model_name == ANY_MODEL)

    def by_key(self, key: str) -> Deployment | None:
        """The deployment the guards call ``key`` (the single endpoint's for any key not in the list)."""
        found = next((d for d in self.deployments if d.key == key), None)
        if found is not None or not self.serves_any_model:
            return found
        return self.of(key)[0]


def single_endpoint() -> ModelList:
    """Today's configuration as a list: one deployment at STREAMPROC_LLM_BASE_URL serving every model."""
    return ModelList((Deployment(ANY_MODEL, ANY_MODEL, ANY_MODEL, None, None),))


def _named_after(deployment: Deployment, model: str) -> Deployment:
    return Deployment(model, model, model, deployment.api_base, deployment.api_key, deployment.rpm,
                      deployment.tpm, deployment.timeout_s, deployment.weight)


def parse_model_list(loaded: object, source: str = "the model list") -> ModelList:
    """The model list of a loaded YAML document (``{"model_list": [...]}``), or :class:`ModelListProblem` naming
    the first thing refused and where (``source`` names the file in the message)."""
    if not isinstance(loaded, Mapping):
        raise ModelListProblem(f"{source}: expected a mapping with a model_list, found {_kind(loaded)}")
    others = sorted(str(key) for key in loaded if key != "model_list")
    if others:
        raise ModelListProblem(f"{source}: unsupported top-level key {others[0]!r} (only model_list is read)")
    entries = loaded.get("model_list")
    if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
        raise ModelListProblem(f"{source}: model_list is a non-empty list of deployments, found {_kind(entries)}")
    counts: dict[str, int] = {}
    deployments = []
    for index, entry in enumerate(entries):
        where = f"{source}: model_list[{index}]"
        deployment = _deployment(entry, where, counts)
        deployments.append(deployment)
    return ModelList(tuple(deployments))


def _deployment(entry: object, where: str, counts: dict[str, int]) -> Deployment:
    if not isinstance(entry, Mapping):
        raise ModelListProblem(f"{where}: a deployment is a mapping, found {_kind(entry)}")
    _refuse_unknown(entry, ENTRY_KEYS, where)
    model_name = entry.get("model_name")
    if not isinstance(model_name, str):
        raise ModelListProblem(f"{where}: model_name is required, a string")
    problem = model_name_problem(model_name)
    if problem is not None:
        raise ModelListProblem(f"{where}: model_name {problem}")
    where = f"{where} ({model_name})"
    params = entry.get("litellm_params")
    if not isinstance(params, Mapping):
        raise ModelListProblem(f"{where}: litellm_params is required, a mapping")
    _refuse_unknown(params, PARAM_KEYS, f"{where}: litellm_params")
    counts[model_name] = counts.get(model_name, 0) + 1
    return Deployment(
        key=f"{model_name}@{counts[model_name]}", model_name=model_name, model=_provider_model(params, where),
        api_base=_optional_text(params, "api_base", where), api_key=_key_source(params, where),
        rpm=_positive(params, "rpm", where), tpm=_positive(params, "tpm", where),
        timeout_s=_positive(params, "timeout", where), weight=_positive(params, "weight", where) or 1.0)


def _refuse_unknown(mapping: Mapping[object, object], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise ModelListProblem(f"{where}: unsupported key {unknown[0]!r} (supported: {', '.join(sorted(allowed))})")


def _provider_model(params: Mapping[object, object], where: str) -> str:
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise ModelListProblem(f"{where}: litellm_params.model is required, e.g. openai/gpt-4o-mini")
    prefix = next((p for p in OPENAI_COMPATIBLE if model.startswith(p)), None)
    if prefix is not None:
        model = model[len(prefix):]
    elif "/" in model:
        provider = model.split("/", 1)[0]
        raise ModelListProblem(f"{where}: provider {provider!r} of model {model!r} is not supported (OpenAI-compatible "
                               f"only: {', '.join(OPENAI_COMPATIBLE)})")
    problem = model_name_problem(model)
    if problem is not None:
        raise ModelListProblem(f"{where}: litellm_params.model {problem}")
    return model


def _key_source(params: Mapping[object, object], where: str) -> ApiKeySource | None:
    key, file = params.get("api_key"), params.get("api_key_file")
    if key is not None and file is not None:
        raise ModelListProblem(f"{where}: api_key or api_key_file, not both")
    if file is not None:
        if not isinstance(file, str) or not file:
            raise ModelListProblem(f"{where}: api_key_file is a path")
        return ApiKeySource(file=file)
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise ModelListProblem(f"{where}: api_key is a string (or os.environ/NAME)")
    if key.startswith(ENV_PREFIX):
        name = key[len(ENV_PREFIX):]
        if not name.isidentifier():
            raise ModelListProblem(f"{where}: api_key {ENV_PREFIX}{name} does not name an environment variable")
        return ApiKeySource(env=name)
    return ApiKeySource(value=key)


def _optional_text(params: Mapping[object, object], name: str, where: str) -> str | None:
    value = params.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise ModelListProblem(f"{where}: {name} is a non-empty string")
    return value


def _positive(params: Mapping[object, object], name: str, where: str) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ModelListProblem(f"{where}: {name} is a positive number, found {value!r}")
    return float(value)


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
