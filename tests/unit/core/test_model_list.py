"""The model list: LiteLLM's model_list as written, refused by name where it asks for what the worker does not do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.model_list import (
    ENTRY_KEYS,
    PARAM_KEYS,
    ApiKeySource,
    Deployment,
    ModelListProblem,
    parse_model_list,
    single_endpoint,
)

TWO_REGIONS: dict[str, Any] = {"model_list": [
    {"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o", "api_base": "https://east.example/v1",
                                                "api_key": "os.environ/EAST_KEY", "rpm": 600, "tpm": 90000,
                                                "weight": 2}},
    {"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o-2024-08-06",
                                                "api_base": "https://west.example/v1",
                                                "api_key_file": "/run/secrets/west", "timeout": 30}},
    {"model_name": "local", "litellm_params": {"model": "hosted_vllm/meta-llama/Llama-3.1-8B-Instruct",
                                               "api_base": "http://127.0.0.1:8000/v1", "api_key": "sk-local"}},
]}


def test_each_deployment_is_read_as_written() -> None:
    models = parse_model_list(TWO_REGIONS)
    east, west, local = models.deployments
    assert east == Deployment("gpt-4o@1", "gpt-4o", "gpt-4o", "https://east.example/v1", ApiKeySource(env="EAST_KEY"),
                              rpm=600, tpm=90000, weight=2)
    assert (west.key, west.model, west.api_key, west.timeout_s, west.weight) == (
        "gpt-4o@2", "gpt-4o-2024-08-06", ApiKeySource(file="/run/secrets/west"), 30, 1.0)
    assert (local.key, local.model, local.api_key) == (
        "local@1", "meta-llama/Llama-3.1-8B-Instruct", ApiKeySource(value="sk-local"))
    assert models.models() == ("gpt-4o", "local") and models.keys() == ("gpt-4o@1", "gpt-4o@2", "local@1")
    assert models.of("gpt-4o") == (east, west) and models.of("other") == ()
    assert models.by_key("gpt-4o@2") == west and models.by_key("gpt-4o") is None
    assert models.serves("local") and not models.serves("other")


def test_the_single_endpoint_serves_every_model_named_as_asked() -> None:
    models = single_endpoint()
    assert models.serves_any_model and models.serves("anything") and models.models() == models.keys() == ()
    [deployment] = models.of("gpt-4o-mini")
    assert (deployment.key, deployment.model, deployment.api_base, deployment.api_key) == (
        "gpt-4o-mini", "gpt-4o-mini", None, None)
    assert models.by_key("gpt-4o-mini") == deployment


@pytest.mark.parametrize(("document", "refusal"), [
    ({"model_list": [], }, "model_list is a non-empty list"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a"}}], "router_settings": {}},
     "unsupported top-level key 'router_settings'"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a"}, "model_info": {}}]},
     "model_list[0]: unsupported key 'model_info'"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "azure/gpt-4o", "api_version": "x"}}]},
     "model_list[0] (a): litellm_params: unsupported key 'api_version'"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "azure/gpt-4o"}}]},
     "provider 'azure' of model 'azure/gpt-4o' is not supported"),
    ({"model_list": [{"model_name": "a b", "litellm_params": {"model": "a"}}]}, "model_name has ' '"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a", "rpm": 0}}]}, "rpm is a positive number"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a", "weight": True}}]},
     "weight is a positive number"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a", "api_key": "os.environ/1X"}}]},
     "does not name an environment variable"),
    ({"model_list": [{"model_name": "a", "litellm_params": {"model": "a", "api_key": "k", "api_key_file": "f"}}]},
     "api_key or api_key_file, not both"),
    ({"model_list": [{"model_name": "a"}]}, "litellm_params is required"),
    (["a"], "expected a mapping with a model_list, found list"),
])
def test_what_is_not_supported_is_refused_by_name(document: object, refusal: str) -> None:
    with pytest.raises(ModelListProblem) as refused:
        parse_model_list(document, "models.yaml")
    assert str(refused.value).startswith("models.yaml: ") and refusal in str(refused.value)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20))
def test_any_key_outside_the_supported_ones_is_named(key: str) -> None:
    params: dict[str, object] = {"model": "openai/m", key: 1}
    entry: dict[str, object] = {"model_name": "m", "litellm_params": {"model": "m"}, key: 1}
    for document, supported in (({"model_list": [{"model_name": "m", "litellm_params": params}]}, PARAM_KEYS),
                                ({"model_list": [entry]}, ENTRY_KEYS)):
        if key in supported:
            continue
        with pytest.raises(ModelListProblem, match=f"unsupported key '{key}'"):
            parse_model_list(document)
