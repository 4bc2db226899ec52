"""Every Kafka client the package builds is built from a KafkaConnection: aiokafka's constructors are called in
streamproc/kafka/clients.py alone, and the faust app is always given the connection's credentials."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "streamproc"
CONSTRUCTORS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "AIOKafkaClient"}
FACTORY = PACKAGE / "kafka" / "clients.py"


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            found.append((name, node))
    return found


def test_aiokafka_clients_are_constructed_in_the_factory_alone() -> None:
    elsewhere = [f"{path.relative_to(PACKAGE.parent)}:{call.lineno} {name}"
                 for path in PACKAGE.rglob("*.py") if path != FACTORY
                 for name, call in _calls(ast.parse(path.read_text())) if name in CONSTRUCTORS]
    assert elsewhere == [], "build Kafka clients with streamproc.kafka.clients (kafka_producer, kafka_consumer, " \
                            f"kafka_admin), never from a bare address: {elsewhere}"


def test_the_factory_hands_every_client_the_connection_security() -> None:
    calls = [call for name, call in _calls(ast.parse(FACTORY.read_text())) if name in CONSTRUCTORS]
    assert len(calls) == 3
    for call in calls:
        spread = [kw.value for kw in call.keywords if kw.arg is None]
        assert any(isinstance(value, ast.Call) and getattr(value.func, "id", "") == "auth_options"
                   for value in spread), f"line {call.lineno} does not pass **auth_options(connection)"


def test_every_faust_app_gets_broker_credentials() -> None:
    apps = [(path, call) for path in PACKAGE.rglob("*.py")
            for name, call in _calls(ast.parse(path.read_text())) if name in ("App", "_DurableApp")]
    assert apps, "no faust App construction found: this test looks for the wrong names"
    for path, call in apps:
        assert "broker_credentials" in {kw.arg for kw in call.keywords}, \
            f"{path.relative_to(PACKAGE.parent)}:{call.lineno} builds a faust App without broker_credentials"
