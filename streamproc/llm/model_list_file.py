"""The worker's deployments: ``STREAMPROC_MODELS_FILE`` read and checked (:mod:`streamproc.core.model_list`), or the
one endpoint of ``STREAMPROC_LLM_BASE_URL``; and each deployment's endpoint with its key read from where the
file says (written out, ``os.environ/NAME``, or ``api_key_file``). Every refusal is one line and exit 3."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import SecretStr

from streamproc.core.model_list import Deployment, ModelList, ModelListProblem, parse_model_list, single_endpoint
from streamproc.errors import UserFacingError
from streamproc.kafka.secrets import check_secret, read_secret_file
from streamproc.settings import LLMEndpoint, RouteSettings


class ModelListError(UserFacingError):
    """The model list is refused, or there is no endpoint to call at all."""


def load_model_list(models_file: Path | None, default: LLMEndpoint) -> ModelList:
    """The deployments to call: the file's, or the single endpoint; refused with the reason when neither is set,
    when the file cannot be read or a deployment has no base URL."""
    if models_file is None:
        if not default.base_url:
            raise ModelListError("no LLM endpoint: set STREAMPROC_LLM_BASE_URL (and STREAMPROC_LLM_API_KEY), or "
                                 "STREAMPROC_MODELS_FILE to a model list")
        return single_endpoint()
    source = f"STREAMPROC_MODELS_FILE {models_file}"
    try:
        loaded = yaml.safe_load(models_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelListError(f"{source}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ModelListError(f"{source}: not YAML: {' '.join(str(exc).split())}") from None
    try:
        models = parse_model_list(loaded, source)
    except ModelListProblem as exc:
        raise ModelListError(str(exc)) from None
    for deployment in models.deployments:
        if deployment.api_base is None and not default.base_url:
            raise ModelListError(f"{source}: {deployment.key} has no api_base, and STREAMPROC_LLM_BASE_URL is not set")
    return models


def check_routes(models: ModelList, routes: RouteSettings) -> None:
    """Refuse fallbacks that name a model the list does not serve: its calls could never go there."""
    if models.serves_any_model:
        return
    named = {*routes.model_fallbacks, *(m for listed in routes.model_fallbacks.values() for m in listed),
             *routes.context_fallbacks, *routes.context_fallbacks.values()}
    missing = sorted(model for model in named if not models.serves(model))
    if missing:
        raise ModelListError(f"STREAMPROC_MODEL_FALLBACKS or STREAMPROC_CONTEXT_FALLBACKS names {missing[0]!r}, which "
                             f"is not in the model list (STREAMPROC_MODELS_FILE serves {', '.join(models.models())})")


def deployment_endpoint(deployment: Deployment, default: LLMEndpoint) -> LLMEndpoint:
    """Where the deployment's calls go: its own base URL, key and read timeout, the rest as configured."""
    source = deployment.api_key
    if source is None:
        key, key_file = default.api_key, default.api_key_file
    else:
        key, key_file = SecretStr(_key_text(deployment)), None
    return default.model_copy(update={
        "base_url": deployment.api_base or default.base_url, "api_key": key, "api_key_file": key_file,
        "read_timeout_s": deployment.timeout_s or default.read_timeout_s})


def _key_text(deployment: Deployment) -> str:
    source = deployment.api_key
    assert source is not None
    what = f"the key of {deployment.key}"
    if source.file is not None:
        return read_secret_file(Path(source.file), f"{what} (api_key_file)")
    if source.env is None:
        assert source.value is not None
        return check_secret(source.value, what)
    value = os.environ.get(source.env)
    if not value:
        raise ModelListError(f"{what}: the environment variable {source.env} (os.environ/{source.env}) is not set")
    return check_secret(value, f"{what} ({source.env})")

