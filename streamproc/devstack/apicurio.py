"""A throwaway schema registry with the Confluent API: Apicurio Registry, built from Maven Central, run with java.

Apicurio publishes its server only as a container image or as jars; the jars are assembled here by a tiny
Quarkus project (its POM below), built once with Maven into the cache directory. Every repository Maven is
asked for is mirrored to Central, because some of the registry's POMs name repositories that are not reachable
from CI. The registry keeps its schemas in memory: each start is empty. Its Confluent API is
``<url>/apis/ccompat/v7``.

A second build enforces HTTP basic auth on every path with Quarkus's own security (users given at start as
properties, so a test chooses them): Quarkus 2.16 fixes the permission policy at build time, so one build cannot
serve both. Apicurio's own authentication mechanism, which needs an OIDC server and fails a challenge without
one, is left out of that build. Each build's directory is named by a digest of its POM and properties: a changed
build makes a new directory, so a machine with an older one builds again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx

from streamproc.devstack.broker import free_port, locked, require_tool
from streamproc.devstack.throwaway import Throwaway
from streamproc.errors import UserFacingError
from streamproc.processes import poll_until, stop_process

APICURIO_VERSION = "2.4.2.Final"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamproc</groupId>
  <artifactId>apicurio-registry-runner</artifactId>
  <version>1</version>
  <packaging>jar</packaging>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement>
    <dependencies>
      <!-- the registry's POM asks for config-index 0.1.18.Final, which is not on Maven Central; 0.1.10.Final is -->
      <dependency>
        <groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index</artifactId>
        <version>0.1.10.Final</version>
      </dependency>
      <dependency>
        <groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index-deployment</artifactId>
        <version>0.1.10.Final</version>
      </dependency>
      <dependency>
        <groupId>io.apicurio</groupId><artifactId>apicurio-registry</artifactId><version>{version}</version>
        <type>pom</type><scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId><version>{version}</version>
      <exclusions>
        <!-- only on jitpack.io; the same classes are on Maven Central as com.github.erosb:everit-json-schema -->
        <exclusion>
          <groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency><groupId>com.github.erosb</groupId><artifactId>everit-json-schema</artifactId><version>1.14.2</version></dependency>
    <!-- HTTP basic auth against users given as properties, so a test can run the registry with a password -->
    <dependency><groupId>io.quarkus</groupId><artifactId>quarkus-elytron-security-properties-file</artifactId></dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>2.16.4.Final</version>
        <executions><execution><goals><goal>build</goal></goals></execution></executions>
      </plugin>
    </plugins>
  </build>
</project>
"""

_APPLICATION_PROPERTIES = """# the registry's classes come in a dependency jar that has no Jandex index
quarkus.index-dependency.registry-app.group-id=io.apicurio
quarkus.index-dependency.registry-app.artifact-id=apicurio-registry-app
quarkus.package.type=fast-jar
"""

_BASIC_AUTH_PROPERTIES = """# HTTP basic auth on every path, for the users given at start (-D...users.<user>=<password>)
quarkus.http.auth.basic=true
quarkus.security.users.embedded.enabled=true
quarkus.security.users.embedded.plain-text=true
quarkus.http.auth.permission.all.paths=/*
quarkus.http.auth.permission.all.policy=authenticated
# Apicurio's mechanism wraps OIDC (disabled here) and fails every challenge without it
quarkus.arc.exclude-types=io.apicurio.common.apps.auth.authn.AppAuthenticationMechanism
"""

_MAVEN_SETTINGS = """<settings>
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url></mirror>
  </mirrors>
</settings>
"""

_RUNNER = "quarkus-run.jar"  # Quarkus's fast-jar layout: this jar and its lib/ directory, movable as one
CONFLUENT_API = "/apis/ccompat/v7"


class SchemaRegistryError(UserFacingError):
    """The local schema registry could not be built or started; the message says why."""


def _properties(basic_auth: bool) -> str:
    return _APPLICATION_PROPERTIES + (_BASIC_AUTH_PROPERTIES if basic_auth else "")


def ensure_registry(cache_dir: Path, basic_auth: bool = False) -> Path:
    """Build the registry once into ``cache_dir`` and return its runnable jar; later calls are instant.
    The build appears whole or not at all, so an interrupted one is redone. Its directory is keyed by what it is
    built from, so a changed POM or properties build anew."""
    properties = _properties(basic_auth)
    digest = hashlib.sha256((_POM + properties).encode()).hexdigest()[:12]
    home = cache_dir / f"apicurio-registry-{APICURIO_VERSION}-{digest}"
    if (home / _RUNNER).exists():
        return home / _RUNNER
    with locked(cache_dir / f".{home.name}-build"):  # two test sessions at once build it once
        if not (home / _RUNNER).exists():
            _build(home, properties)
    return home / _RUNNER


def _build(home: Path, properties: str) -> None:
    require_tool("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
    mvn = require_tool("mvn", "Maven (Debian: apt-get install maven)")
    with tempfile.TemporaryDirectory(dir=home.parent) as work:
        project = Path(work)
        (project / "pom.xml").write_text(_POM.format(version=APICURIO_VERSION))
        (project / "settings.xml").write_text(_MAVEN_SETTINGS)
        resources = project / "src" / "main" / "resources"
        resources.mkdir(parents=True)
        (resources / "application.properties").write_text(properties)
        proc = subprocess.run([mvn, "-B", "-q", "-s", "settings.xml", "-DskipTests", "package"],
                              cwd=project, capture_output=True, text=True, check=False)
        built = project / "target" / "quarkus-app"
        if proc.returncode != 0 or not (built / _RUNNER).exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise SchemaRegistryError(f"Maven could not build Apicurio Registry {APICURIO_VERSION}:\n"
                                      + "\n".join(tail))
        if home.exists():
            shutil.rmtree(home)
        built.rename(home)


class ThrowawaySchemaRegistry(Throwaway):
    """``with ThrowawaySchemaRegistry(cache_dir) as registry: registry.url`` -- an empty registry on 127.0.0.1
    and a free port until the block ends; its log is kept in a temporary directory removed on stop. With
    ``credentials`` (user, password) every path asks for HTTP basic auth with them."""

    def __init__(self, cache_dir: Path, credentials: tuple[str, str] | None = None) -> None:
        self._jar = ensure_registry(cache_dir, basic_auth=credentials is not None)
        self.credentials = credentials
        self._root = Path(tempfile.mkdtemp(prefix="streamproc-registry-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.confluent_url = self.url + CONFLUENT_API
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> ThrowawaySchemaRegistry:
        java = require_tool("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
        with open(self._root / "registry.log", "wb") as log:
            self._process = subprocess.Popen(
                [java, "-Xmx256m", "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                 *self._users(), "-jar", str(self._jar)],
                cwd=self._root, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        if not poll_until(self._ready, timeout_s, 0.25):
            raise SchemaRegistryError(f"the schema registry was not ready within {timeout_s:.0f} s:\n"
                                      + self._log_tail())
        return self

    def _users(self) -> list[str]:
        if self.credentials is None:
            return []
        user, password = self.credentials
        return [f"-Dquarkus.security.users.embedded.users.{user}={password}"]

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise SchemaRegistryError(f"the schema registry exited ({self._process.returncode}):\n"
                                      + self._log_tail())
        try:
            return httpx.get(self.url + "/health/ready", timeout=2.0, auth=self.credentials).status_code == 200
        except httpx.HTTPError:
            return False

    def _log_tail(self, lines: int = 20) -> str:
        log = self._root / "registry.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def stop(self) -> None:
        try:
            if self._process is not None:
                stop_process(self._process, grace_s=20.0)
        finally:
            shutil.rmtree(self._root, ignore_errors=True)
