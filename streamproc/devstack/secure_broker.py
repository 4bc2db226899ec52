"""The built-in broker with authentication and ACLs (``streamproc broker start --secure``), so clients configured
from a Java client properties file can be tested against a real secured Kafka.

One KRaft node (a :class:`LocalBroker` under ``<data dir>/kafka-secure``) with three client listeners on
127.0.0.1: SCRAM (SASL_SSL, SCRAM-SHA-512 and -256), MTLS (SSL, a client certificate required, CN=worker is
``User:worker``) and OAUTH (SASL_SSL, OAUTHBEARER checked by Kafka's unsecured-JWS validator). ACLs come from
:func:`streamproc.core.acls.acl_plan` and are added with Kafka's own ``kafka.admin.AclCommand``; the only super
user is the broker's own certificate. Passwords, keys and client files stay in the home, mode 0600.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamproc.core.acls import PRINCIPALS, acl_command_calls, acl_plan, plan_lines
from streamproc.core.topology import Topology
from streamproc.devstack.broker import (
    LocalBroker,
    LocalKafkaError,
    ensure_jars,
    fetch_jars,
    free_port,
    locked,
    quorum_properties,
    require_tool,
)
from streamproc.devstack.certificates import BROKER_CN, CertificateSet, certificate_set, ensure_certificates, write_file
from streamproc.devstack.client_properties import (
    mtls_properties,
    oauth_properties,
    scram_properties,
    unsecured_oauth_properties,
    write_properties,
)
from streamproc.kafka.local_address import port_accepts
from streamproc.settings import Settings

SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
LISTENERS = ("scram", "mtls", "oauth")
"""The client listeners, in the order of their ports (``STREAMPROC_LOCAL_KAFKA_PORT`` and the next two)."""
ADMIN_FILE = "broker-admin.properties"
"""mTLS as the broker's own principal, the one super user: what AclCommand runs as (nothing else may add ACLs
before the first ones exist)."""

_TOOLS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamproc</groupId>
  <artifactId>local-kafka-tools</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""

_TOOLS_LOG4J = """log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
"""

_RUN_CALLS = """import java.nio.file.Files;
import java.nio.file.Path;

/** Runs a Kafka tool's main once per line of a file (arguments separated by tabs), in this one JVM. */
public class RunCalls {
    public static void main(String[] args) throws Exception {
        var main = Class.forName(args[0]).getMethod("main", String[].class);
        for (String line : Files.readAllLines(Path.of(args[1]))) {
            if (!line.isEmpty()) {
                main.invoke(null, (Object) line.split("\\t"));
            }
        }
        System.exit(0);
    }
}
"""

# a short-lived tool JVM starts in about half the time without the optimising compiler and with one GC thread
_TOOL_JVM = ["-Xms64m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]


@dataclass(frozen=True)
class SecurePorts:
    scram: int
    mtls: int
    oauth: int
    controller: int

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{getattr(self, listener)}"

    def all(self) -> list[int]:
        return [self.scram, self.mtls, self.oauth, self.controller]


def secure_server_properties(ports: SecurePorts, log_dir: Path, certificates: CertificateSet) -> str:
    """A single KRaft node whose every listener authenticates its peer; only the broker's certificate is a super
    user. The controller listener uses mutual TLS too: the broker reaches its controller there as ``User:broker``
    (it needs ClusterAction), and a PLAINTEXT controller listener would have made the anonymous principal, which
    any local process gets there, a super user."""
    scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    listeners = ",".join(f"{name.upper()}://{ports.address(name)}" for name in LISTENERS)
    return "\n".join([
        f"listeners={listeners},CONTROLLER://127.0.0.1:{ports.controller}",
        f"advertised.listeners={listeners}",
        "listener.security.protocol.map=SCRAM:SASL_SSL,MTLS:SSL,OAUTH:SASL_SSL,CONTROLLER:SSL",
        "inter.broker.listener.name=MTLS",
        "controller.listener.names=CONTROLLER",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={certificates.broker}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certificates.ca}",
        # the subject's CN is the principal's name: CN=worker -> User:worker
        "ssl.principal.mapping.rules=RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT",
        "listener.name.mtls.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        f"listener.name.scram.sasl.enabled.mechanisms={','.join(SCRAM_MECHANISMS)}",
        *(f"listener.name.scram.{mechanism.lower()}.sasl.jaas.config={scram_jaas}" for mechanism in SCRAM_MECHANISMS),
        "listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER",
        # no server callback handler set: Kafka validates OAUTHBEARER tokens with its unsecured-JWS validator
        # (alg "none", the principal is "sub"), so any client may name any principal here, the broker's too: a
        # dev and test listener on loopback, never one to expose. The login option only gives the broker's own
        # (unused) token a subject.
        "listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer."
        f'OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="{BROKER_CN}";',
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{BROKER_CN}",
        *quorum_properties(1, [ports.controller], log_dir),
        "",
    ])


def scram_format_args(passwords: Mapping[str, str]) -> list[str]:
    """StorageTool arguments that create every SCRAM user (both mechanisms) in the first metadata records."""
    args = []
    for user, password in passwords.items():
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return args


@dataclass(frozen=True)
class SecureBrokerStatus:
    """Where the secure broker listens and every file a client needs; passwords only in the Python API."""

    running: bool
    pid: int | None
    version: str
    home: Path
    listeners: dict[str, str]
    """``scram``/``mtls``/``oauth`` -> ``127.0.0.1:port`` (empty when stopped)."""
    ca: Path
    certificates: dict[str, Path]
    """principal -> key + certificate chain PEM; also ``broker``, ``worker-expired``, ``other-ca`` (a CA cert
    only) and ``worker-other-ca`` (a worker certificate from the other CA)."""
    client_properties: dict[str, Path]
    """``<principal>-scram``, ``<principal>-mtls`` and ``<principal>-oauth-unsecured`` (the Java client makes its
    own unsecured token) -> Java client properties file; ``broker-admin``: mTLS as the super user;
    ``<principal>-oauth`` once written with a token endpoint."""
    scram_passwords: dict[str, str] = field(repr=False)
    oauth_client_secrets: dict[str, str] = field(repr=False)
    acls: tuple[str, ...] = ()

    @property
    def bootstrap(self) -> str | None:
        """The SCRAM listener: the default way in."""
        return self.listeners.get("scram")

    def describe(self) -> str:
        if not self.running:
            return "stopped"
        lines = [f"running: secure Kafka {self.version} pid {self.pid}",
                 *(f"  {name:<6} {address}" for name, address in self.listeners.items()),
                 f"  CA     {self.ca}",
                 "client properties files:",
                 *(f"  {path}" for path in self.client_properties.values()),
                 "  (OAUTHBEARER from a token endpoint: SecureBroker.write_oauth_properties(principal, url))",
                 "ACLs:",
                 *(f"  {line}" for line in self.acls)]
        return "\n".join(lines)

    def as_json(self) -> dict[str, object]:
        """``broker status --secure --json``: addresses and paths, no secrets (they are in the 0600 files)."""
        document = dataclasses.asdict(self)
        for secret in ("scram_passwords", "oauth_client_secrets"):
            document.pop(secret)
        return json.loads(json.dumps(document, default=str))  # type: ignore[no-any-return]


class SecureBroker:
    """The secure single broker of ``settings.data_dir``; every method is safe to call in any state."""

    def __init__(self, settings: Settings, home: Path | None = None) -> None:
        self.settings = settings
        self.home = home or settings.data_dir / "kafka-secure"
        self.node = LocalBroker(settings, home=self.home)
        self.ports_file = self.home / "listeners.json"
        self.secrets_file = self.home / "secrets.json"
        self.acls_file = self.home / "acls.applied"
        self.files_dir = self.home / "clients"
        self.tls_dir = self.home / "tls"

    # -- state -------------------------------------------------------------------------------------------
    def _ports(self) -> SecurePorts | None:
        try:
            return SecurePorts(**json.loads(self.ports_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None

    def _secrets(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.secrets_file.read_text())
            return {"scram": dict(data["scram"]), "oauth": dict(data["oauth"])}
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return {}

    def _ensure_secrets(self) -> dict[str, dict[str, str]]:
        """Random SCRAM passwords and OAuth client secrets, kept across restarts; new ones mean a new cluster
        (the SCRAM users live in the metadata formatted with the old ones)."""
        existing = self._secrets()
        if set(existing.get("scram", {})) == set(PRINCIPALS):
            return existing
        made = {kind: {user: secrets.token_urlsafe(24) for user in PRINCIPALS} for kind in ("scram", "oauth")}
        shutil.rmtree(self.node.data_dir, ignore_errors=True)
        self.acls_file.unlink(missing_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        write_file(self.secrets_file, json.dumps(made).encode())
        return made

    def certificates(self) -> CertificateSet:
        return ensure_certificates(self.tls_dir, PRINCIPALS)

    def status(self) -> SecureBrokerStatus:
        node = self.node.status()
        ports = self._ports()
        running = node.running and ports is not None
        certs = certificate_set(self.tls_dir, PRINCIPALS)
        stored = self._secrets()
        files = sorted(self.files_dir.glob("*.properties")) if running else []
        return SecureBrokerStatus(
            running=running, pid=node.pid, version=node.version, home=self.home,
            listeners={name: ports.address(name) for name in LISTENERS} if running and ports else {},
            ca=certs.ca, certificates=_certificate_files(certs),
            client_properties={path.stem: path for path in files},
            scram_passwords=stored.get("scram", {}), oauth_client_secrets=stored.get("oauth", {}),
            acls=tuple(plan_lines(acl_plan(self.settings.topology()))),
        )

    # -- start -------------------------------------------------------------------------------------------
    def _choose_ports(self) -> SecurePorts:
        """STREAMPROC_LOCAL_KAFKA_PORT and the next two for SCRAM, MTLS and OAUTH and the configured controller
        port; for 0, the previous run's ports when all are free (clients keep their files), else free ones."""
        port, controller = self.settings.local_kafka_port, self.settings.local_kafka_controller_port
        if port:
            wanted = SecurePorts(port, port + 1, port + 2, controller or free_port())
            taken = [p for p in wanted.all() if port_accepts(p)]
            if taken:
                raise LocalKafkaError(f"ports {taken} on 127.0.0.1 are taken: the secure broker needs "
                                      f"STREAMPROC_LOCAL_KAFKA_PORT and the next two free (or 0 for any)")
            return wanted
        previous = self._ports()
        if previous is not None and not any(port_accepts(p) for p in previous.all()):
            return previous
        chosen: list[int] = []
        while len(chosen) < 4:
            candidate = free_port()
            if candidate not in chosen:
                chosen.append(candidate)
        return SecurePorts(*chosen)

    def start(self, timeout: float = 120.0) -> SecureBrokerStatus:
        """Start the broker, write the client files and add the ACLs of the settings' topology; returns once
        clients can connect (a no-op but for the ACLs when it runs already)."""
        with locked(self.home):
            if not self.status().running:
                self.node.kill_stale()
                stored = self._ensure_secrets()
                certs = self.certificates()
                ports = self._choose_ports()
                self.ports_file.write_text(json.dumps(dataclasses.asdict(ports)))
                proc = self.node.launch(secure_server_properties(ports, self.node.data_dir, certs), ports.scram,
                                        ports.controller, format_args=scram_format_args(stored["scram"]))
                self.node.await_ready(proc, ports.scram, timeout)
                self._write_client_files(ports, certs, stored["scram"])
            self.apply_acls(self.settings.topology())
            return self.status()

    def _write_client_files(self, ports: SecurePorts, certs: CertificateSet, passwords: Mapping[str, str]) -> None:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        for user in PRINCIPALS:
            write_properties(self.files_dir / f"{user}-scram.properties",
                             scram_properties(ports.address("scram"), certs.ca, user, passwords[user]))
            write_properties(self.files_dir / f"{user}-mtls.properties",
                             mtls_properties(ports.address("mtls"), certs.ca, certs.keystores[user]))
            write_properties(self.files_dir / f"{user}-oauth-unsecured.properties",
                             unsecured_oauth_properties(ports.address("oauth"), certs.ca, user))
        write_properties(self.files_dir / ADMIN_FILE, mtls_properties(ports.address("mtls"), certs.ca, certs.broker))

    def write_oauth_properties(self, user: str, token_endpoint_url: str) -> Path:
        """``<user>-oauth.properties`` for the running broker: OAUTHBEARER with tokens from ``token_endpoint_url``
        (a client-credentials endpoint the caller runs; the broker accepts unsecured JWS tokens whose ``sub``
        is the principal), client id ``user`` and its secret from the home."""
        ports = self._ports()
        if ports is None or user not in PRINCIPALS:
            raise LocalKafkaError(f"no secure broker in {self.home} or no principal {user!r} (one of {PRINCIPALS})")
        secret = self._secrets()["oauth"][user]
        self.files_dir.mkdir(parents=True, exist_ok=True)
        return write_properties(self.files_dir / f"{user}-oauth.properties",
                                oauth_properties(ports.address("oauth"), self.certificates().ca, user, secret,
                                                 token_endpoint_url))

    # -- ACLs --------------------------------------------------------------------------------------------
    def _cluster_id(self) -> str:
        meta = self.node.data_dir / "meta.properties"
        for line in meta.read_text().splitlines() if meta.exists() else []:
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
        return ""

    def apply_acls(self, topology: Topology) -> list[str]:
        """Add the ACLs of ``topology`` with AclCommand unless this cluster has them already; returns the plan's
        lines. ACLs of an earlier topology stay (Kafka adds, it does not replace)."""
        plan = acl_plan(topology)
        lines = plan_lines(plan)
        record = "\n".join([f"cluster.id={self._cluster_id()}", *lines])
        applied = self.acls_file.read_text() if self.acls_file.exists() else ""
        if record == applied:
            return lines
        ports = self._ports()
        if ports is None:
            raise LocalKafkaError(f"no secure broker in {self.home}: start it first")
        admin = ["--bootstrap-server", ports.address("mtls"), "--command-config", str(self.files_dir / ADMIN_FILE)]
        calls = [[*admin, *call.arguments()] for call in acl_command_calls(plan)]
        proc = self.run_tool_calls("kafka.admin.AclCommand", calls, timeout=180)
        if proc.returncode != 0:
            raise LocalKafkaError(f"kafka.admin.AclCommand failed:\n{(proc.stdout + proc.stderr).strip()[-3000:]}")
        self.acls_file.write_text(record)
        return lines

    def run_tool_calls(self, main_class: str, calls: Sequence[Sequence[str]],
                       timeout: float) -> subprocess.CompletedProcess[str]:
        """Run Kafka's tool ``main_class`` once per argument list, all in one JVM (a JVM start costs two seconds
        on a busy machine, and AclCommand takes one resource type and set of operations per run); stops at the
        first that fails."""
        if any(ch in arg for args in calls for arg in args for ch in "\t\n"):
            raise ValueError(f"a tool argument may not hold a tab or a line break: {calls}")
        calls_file = self.home / "tool-calls.tsv"
        calls_file.write_text("".join("\t".join(args) + "\n" for args in calls))
        runner = self.home / "RunCalls.java"
        runner.write_text(_RUN_CALLS)
        return subprocess.run(tool_command(self.settings, self.home, str(runner), [main_class, str(calls_file)]),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def run_tool(self, main_class: str, args: Sequence[str], timeout: float,
                 extra_jars: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's command-line tools from the cached jars (warnings and errors on stderr)."""
        return subprocess.run(tool_command(self.settings, self.home, main_class, args, extra_jars),
                              capture_output=True, text=True, timeout=timeout, check=False)

    # -- stop --------------------------------------------------------------------------------------------
    def stop(self, grace: float = 60.0) -> bool:
        """Stop the broker; its data, certificates, passwords and files stay for the next start."""
        return self.node.stop(grace)


def _certificate_files(certs: CertificateSet) -> dict[str, Path]:
    return {**certs.keystores, BROKER_CN: certs.broker, "worker-expired": certs.expired,
            "other-ca": certs.other_ca, "worker-other-ca": certs.other_ca_client}


def ensure_tools_jars(settings: Settings) -> Path:
    """The ``kafka-tools`` jar (the console consumer and producer of Kafka 3.9), fetched once beside the
    broker's jars, without its dependencies: the broker's jars hold them."""
    version = settings.local_kafka_version
    return fetch_jars(_TOOLS_POM.format(version=version), settings.local_stack.kafka_jars_dir.parent / "tools",
                      "kafka-tools-*.jar", f"Kafka {version} tools", "-DexcludeTransitive=true")


def tool_command(settings: Settings, home: Path, main_class: str, args: Sequence[str],
                 extra_jars: Path | None = None) -> list[str]:
    """``java ... main_class args`` with the broker's jars (and ``extra_jars``) and quiet logging."""
    java = require_tool("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
    classpath = [str(ensure_jars(settings) / "*")] + ([str(extra_jars / "*")] if extra_jars else [])
    log4j = home / "tools-log4j.properties"
    if not log4j.exists():
        home.mkdir(parents=True, exist_ok=True)
        log4j.write_text(_TOOLS_LOG4J)
    return [java, *_TOOL_JVM, f"-Dlog4j.configuration=file:{log4j}", "-cp", os.pathsep.join(classpath),
            main_class, *args]


def console_consumer_command(settings: Settings, home: Path, bootstrap: str, config: Path, topic: str,
                             max_messages: int, timeout_ms: int) -> list[str]:
    """Kafka's own console consumer reading ``topic`` from its start with the client file ``config``; no group
    (partition 0 assigned, offsets not committed), so only Read on the topic is needed."""
    return tool_command(settings, home, "org.apache.kafka.tools.consumer.ConsoleConsumer",
                        ["--bootstrap-server", bootstrap, "--consumer.config", str(config), "--topic", topic,
                         "--partition", "0", "--offset", "earliest", "--max-messages", str(max_messages),
                         "--timeout-ms", str(timeout_ms)],
                        extra_jars=ensure_tools_jars(settings))
