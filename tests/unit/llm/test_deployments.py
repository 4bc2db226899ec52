"""Several deployments of a model: the list read from its file with its keys, each deployment's own client, the
routing that balances them, takes a failing one out and sends its calls on to the others, unbudgeted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.routing import Routes
from streamproc.core.model_list import parse_model_list
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.errors import ExitCode
from streamproc.llm.client import CallResult, LLMClient
from streamproc.llm.deployments import DeploymentCaller
from streamproc.llm.guarded import MODEL_NOT_LISTED, Deferred, Guards
from streamproc.llm.model_list_file import ModelListError, check_routes, deployment_endpoint, load_model_list
from streamproc.settings import BreakerSettings, Settings
from tests.unit.app.test_handler_guards import MonotonicClock

REQUEST = InferenceRequest("r-1", "{}", batch_id="b")
BODY: dict[str, Any] = {"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}
MODELS = parse_model_list({"model_list": [
    {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-east", "api_base": "http://127.0.0.1:1/v1"}},
    {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-west", "api_base": "http://127.0.0.1:2/v1"}},
    {"model_name": "mini", "litellm_params": {"model": "mini", "api_base": "http://127.0.0.1:3/v1"}},
]})
BREAKERS = BreakerSettings(failure_rate=0.5, window_s=10, min_calls=3, open_s=5, hold_s=0)
DOWN = Failure(FailureLayer.TRANSPORT, "connect_error", "connection refused")
REFUSED = Failure(FailureLayer.BUSINESS, "invalid_request_error", "HTTP 400: unsupported parameter", 400)


class Deployments:
    """The caller below the guards: answers per deployment key, a failure for the keys in ``down``, a refusal for
    those in ``refusing``."""

    def __init__(self, down: set[str] | None = None, latency_ms: dict[str, int] | None = None,
                 refusing: set[str] | None = None) -> None:
        self.down = down or set()
        self.refusing = refusing or set()
        self.latency_ms = latency_ms or {}
        self.calls: list[str] = []

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        key = body["model"]
        self.calls.append(key)
        if key in self.down or key in self.refusing:
            return CallResult(DOWN if key in self.down else REFUSED, b"", 1, model=key)
        return CallResult(Success("ok", key, 1, 1), b"{}", self.latency_ms.get(key, 100), model=key)


def guards(caller: Deployments, **options: Any) -> tuple[Guards, MonotonicClock]:
    clock = MonotonicClock()
    return Guards(caller, models=MODELS, breakers=BREAKERS, clock=clock, sleep=clock.sleep, wait=clock.wait,
                  **options), clock


async def test_calls_alternate_over_equal_deployments_and_name_the_one_that_answered() -> None:
    caller = Deployments()
    guarded, _ = guards(caller)
    answers = [await guarded.call(REQUEST, BODY, 1) for _ in range(4)]
    assert caller.calls == ["gpt@1", "gpt@2", "gpt@1", "gpt@2"]
    assert [(a.model, a.deployment) for a in answers if isinstance(a, CallResult)] == [
        ("gpt", "gpt@1"), ("gpt", "gpt@2"), ("gpt", "gpt@1"), ("gpt", "gpt@2")]


async def test_a_failing_deployment_is_taken_out_and_its_calls_go_on_to_the_other_unbudgeted() -> None:
    caller, budget = Deployments(down={"gpt@1"}), RetryBudget()
    guarded, _ = guards(caller, budget=budget)
    for _ in range(10):
        answer = await guarded.call(REQUEST, BODY, 1)
        assert isinstance(answer, CallResult) and isinstance(answer.outcome, Success) and answer.deployment == "gpt@2"
    assert budget.counts("b") == (10, 0)  # one first attempt per call, no retry spent
    assert guarded.breaker_states()["gpt@1"].value == "open"
    assert caller.calls.count("gpt@1") == 3  # min_calls failures, then out
    assert guarded.fallbacks[("gpt@1", "gpt", "deployment_failed")] == 3


async def test_an_open_deployment_is_probed_back_in() -> None:
    caller = Deployments(down={"gpt@1"})
    guarded, clock = guards(caller)
    for _ in range(6):
        await guarded.call(REQUEST, BODY, 1)
    caller.down.clear()
    clock.now += BREAKERS.open_s
    for _ in range(4):
        await guarded.call(REQUEST, BODY, 1)
    assert guarded.breaker_states()["gpt@1"].value == "closed"
    assert caller.calls[-4:].count("gpt@1") >= 1


async def test_when_every_deployment_is_out_the_model_fallback_applies() -> None:
    caller = Deployments(down={"gpt@1", "gpt@2"})
    guarded, _ = guards(caller, routes=Routes(model_fallbacks={"gpt": ["mini"]}))
    for _ in range(3):
        answer = await guarded.call(REQUEST, BODY, 1)
        assert isinstance(answer, CallResult) and isinstance(answer.outcome, Failure)  # both failed it
    answer = await guarded.call(REQUEST, BODY, 1)
    assert isinstance(answer, CallResult) and (answer.model, answer.deployment) == ("mini", "mini@1")
    assert guarded.fallbacks[("gpt", "mini", "breaker_open")] == 1


async def test_without_a_fallback_a_model_whose_deployments_are_all_out_is_deferred_naming_them() -> None:
    guarded, _ = guards(Deployments(down={"gpt@1", "gpt@2"}))
    for _ in range(3):
        await guarded.call(REQUEST, BODY, 1)
    deferred = await guarded.call(REQUEST, BODY, 1)
    assert isinstance(deferred, Deferred) and deferred.code == "circuit_open"
    assert "every deployment of gpt is out" in deferred.reason and "gpt@1, gpt@2" in deferred.reason


async def test_a_deployment_paused_for_failing_alike_is_out_with_the_failure_that_paused_it() -> None:
    """Its calls go to the other deployment while it waits for its probe; the fleet beat (and so status) names it."""
    caller = Deployments(refusing={"gpt@1"})
    guarded, _ = guards(caller)
    for _ in range(8):
        await guarded.call(REQUEST, BODY, 1)
    assert caller.calls.count("gpt@1") == 3  # its first three calls, then paused
    assert guarded.breaker_states()["gpt@1"].value == "closed"  # a refusal is no breaker's business
    assert guarded.out() == {"gpt@1": "paused: its first 3 calls all failed alike: invalid_request_error (HTTP 400): "
                                      "HTTP 400: unsupported parameter"}


async def test_a_slower_deployment_gets_fewer_calls() -> None:
    caller = Deployments(latency_ms={"gpt@1": 100, "gpt@2": 200})
    guarded, _ = guards(caller)
    for _ in range(30):
        await guarded.call(REQUEST, BODY, 1)
    assert caller.calls.count("gpt@2") < caller.calls.count("gpt@1")


def test_a_model_outside_the_list_is_refused_before_any_call() -> None:
    guarded, _ = guards(Deployments())
    refused = guarded.precheck({**BODY, "model": "gpt-5"})
    assert isinstance(refused, Failure) and refused.code == MODEL_NOT_LISTED and "gpt, mini" in refused.message


async def test_each_deployment_has_its_own_client_and_is_sent_its_own_model_name() -> None:
    seen: list[tuple[str, str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host + f":{request.url.port}", request.headers.get("authorization", ""),
                     request.read().decode()))
        return httpx.Response(200, json={"model": "x", "choices": [{"message": {"content": "ok"}}]})

    models = parse_model_list({"model_list": [
        {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-east", "api_base": "http://127.0.0.1:1/v1",
                                                 "api_key": "sk-east"}},
        {"model_name": "gpt", "litellm_params": {"model": "gpt-west", "api_base": "http://127.0.0.1:2/v1"}}]})
    default = Settings(llm_base_url="http://127.0.0.1:9/v1", llm_api_key="sk-default", llm_http="httpcore").llm_endpoint
    clients = {d.key: LLMClient(deployment_endpoint(d, default), connections=4, hedge_ratio=0,
                                transport=httpx.MockTransport(answer)) for d in models.deployments}
    caller = DeploymentCaller(models, clients)
    for key in ("gpt@1", "gpt@2"):
        called = await caller.call(InferenceRequest("r", "{}"), {**BODY, "model": key})
        assert called.model == key and isinstance(called.outcome, Success)
    assert [(host, auth) for host, auth, _ in seen] == [("127.0.0.1:1", "Bearer sk-east"),
                                                        ("127.0.0.1:2", "Bearer sk-default")]
    assert '"gpt-east"' in seen[0][2] and '"gpt-west"' in seen[1][2]
    await caller.aclose()


def test_keys_come_from_the_environment_or_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "west").write_text("sk-west\n", encoding="utf-8")
    models_file = tmp_path / "models.yaml"
    models_file.write_text(f"""model_list:
  - model_name: gpt
    litellm_params: {{model: openai/gpt, api_base: "https://east.example/v1", api_key: os.environ/EAST_KEY}}
  - model_name: gpt
    litellm_params: {{model: openai/gpt, api_base: "https://west.example/v1", api_key_file: {tmp_path / 'west'}}}
""", encoding="utf-8")
    default = Settings().llm_endpoint
    models = load_model_list(models_file, default)
    monkeypatch.setenv("EAST_KEY", "sk-east")
    east, west = (deployment_endpoint(d, default) for d in models.deployments)
    assert east.api_key is not None and east.api_key.get_secret_value() == "sk-east"
    assert west.api_key is not None and west.api_key.get_secret_value() == "sk-west"
    assert (east.base_url, west.base_url) == ("https://east.example/v1", "https://west.example/v1")
    monkeypatch.delenv("EAST_KEY")
    with pytest.raises(ModelListError, match=r"EAST_KEY .* is not set"):
        deployment_endpoint(models.deployments[0], default)


@pytest.mark.parametrize(("text", "refusal"), [
    ("model_list:\n  - model_name: gpt\n    litellm_params: {model: gpt, max_parallel_requests: 4}\n",
     "unsupported key 'max_parallel_requests'"),
    ("model_list: [\n", "not YAML"),
    ("model_list:\n  - model_name: gpt\n    litellm_params: {model: gpt}\n",
     "gpt@1 has no api_base, and STREAMPROC_LLM_BASE_URL is not set"),
])
def test_a_refused_file_stops_the_worker_in_one_line(tmp_path: Path, text: str, refusal: str) -> None:
    models_file = tmp_path / "models.yaml"
    models_file.write_text(text, encoding="utf-8")
    with pytest.raises(ModelListError) as refused:
        load_model_list(models_file, Settings().llm_endpoint)
    assert refusal in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code is ExitCode.CONFIGURATION


def test_neither_a_file_nor_a_base_url_is_refused() -> None:
    with pytest.raises(ModelListError, match="no LLM endpoint: set STREAMPROC_LLM_BASE_URL"):
        load_model_list(None, Settings().llm_endpoint)
    assert load_model_list(None, Settings(llm_base_url="http://127.0.0.1:1/v1").llm_endpoint).serves_any_model


def test_a_fallback_outside_the_model_list_is_refused() -> None:
    check_routes(MODELS, Settings(model_fallbacks={"gpt": ["mini"]}).guards.routes)
    single = load_model_list(None, Settings(llm_base_url="http://127.0.0.1:1/v1").llm_endpoint)
    check_routes(single, Settings(model_fallbacks={"gpt": ["anything"]}).guards.routes)  # it serves any model
    with pytest.raises(ModelListError, match="names 'gpt-4o-mini', which is not in the model list"):
        check_routes(MODELS, Settings(model_fallbacks={"gpt": ["gpt-4o-mini"]}).guards.routes)
    with pytest.raises(ModelListError, match="names 'large'"):
        check_routes(MODELS, Settings(context_fallbacks={"gpt": "large"}).guards.routes)


def test_the_readme_s_model_list_has_two_deployments_and_a_fallback_to_another_provider(
        tmp_path: Path) -> None:
    """README.md shows a model on two deployments and, when both are out, a fallback served elsewhere: the file
    loads as it is and the fallback setting it names passes the worker's start checks."""
    readme = (Path(__file__).parents[3] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Several deployments of a model", 1)[1]
    (tmp_path / "models.yaml").write_text(section.split("```yaml\n", 1)[1].split("```", 1)[0], encoding="utf-8")
    fallbacks = section.split("STREAMPROC_MODEL_FALLBACKS='", 1)[1].split("'", 1)[0]
    settings = Settings(llm_base_url=None, models_file=tmp_path / "models.yaml", model_fallbacks=json.loads(fallbacks))
    models = load_model_list(settings.models_file, settings.llm_endpoint)
    check_routes(models, settings.guards.routes)
    (model, (fallback,)), = settings.guards.routes.model_fallbacks.items()
    bases = {d.api_base for d in models.of(model)}
    assert len(models.of(model)) == 2 and len(bases) == 2
    assert all(d.api_base not in bases for d in models.of(fallback))
