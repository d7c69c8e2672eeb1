"""A real Schema Registry on loopback: Apicurio Registry, through its Confluent-compatible REST API.

mvlog's Avro sources look writer schemas up in a Confluent-API Schema Registry
(:mod:`mvlog.connectors.kafka.schema_registry`). Confluent's own registry is not on Maven Central (only on
packages.confluent.io, which is not a registry mvlog downloads from) and Karapace is not on PyPI; Apicurio
Registry is on Maven Central, whole: ``io.apicurio:apicurio-registry-app:<version>:all`` is the Quarkus
build of the application (a runner jar and its ``lib/``) as a tar.gz. ``infra/registry/pom.xml`` names it;
Maven unpacks it into ``~/.cache/mvlog/apicurio-registry-<version>/app`` (or
``$MVLOG_SCHEMA_REGISTRY_HOME/app``), reused when present. ``make setup`` resolves it
(:func:`ensure_registry_app`).

:class:`RegistryServer` runs it with its default storage, an in-memory H2 database (nothing on disk: a
stopped registry forgets its schemas), its HTTP listener bound to 127.0.0.1 only. Its Confluent API is
at ``/apis/ccompat/v7`` (:attr:`RegistryServer.url`): what ``--schema-registry`` and Confluent's
``SchemaRegistryClient`` are given. Apicurio 3.0.x runs on Java 17, the runtime mvlog already needs.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mvlog.infra.child_processes import ServerProcess
from mvlog.infra.kafka_broker import find_java
from mvlog.infra.maven_jars import JarSetupError, cache_folder, pom_property, resolve_jars

__all__ = ["CCOMPAT_PATH", "REGISTRY_HOME_ENV", "RegistryServer", "apicurio_version", "ensure_registry_app",
           "registry_home"]

REGISTRY_HOME_ENV = "MVLOG_SCHEMA_REGISTRY_HOME"
POM = Path(__file__).resolve().parent / "registry" / "pom.xml"
LOOPBACK = "127.0.0.1"
CCOMPAT_PATH = "/apis/ccompat/v7"  # Apicurio's Confluent Schema Registry API (v7)


def apicurio_version(pom: Path = POM) -> str:
    """The Apicurio Registry version the pom names (its ``apicurio.version`` property)."""
    return pom_property(pom, "apicurio.version")


def registry_home(environ: Mapping[str, str] = os.environ) -> Path:
    """``$MVLOG_SCHEMA_REGISTRY_HOME``, else ``~/.cache/mvlog/apicurio-registry-<version>``."""
    return cache_folder(REGISTRY_HOME_ENV, f"apicurio-registry-{apicurio_version()}", environ)


def _runner(app: Path) -> Path | None:
    """The application's runner jar in ``app`` when the unpacked application is there (its lib/ too)."""
    runners = sorted(app.glob("apicurio-registry-app-*-runner.jar")) if app.is_dir() else []
    return runners[0] if runners and (app / "lib").is_dir() else None


def ensure_registry_app(home: Path | None = None) -> Path:
    """The runner jar of Apicurio Registry, unpacked from Maven Central by ``mvn`` when not there yet."""
    home = home or registry_home()
    runner = _runner(home / "app")
    if runner is not None:
        return runner
    find_java()
    app = resolve_jars(POM, home, what="Apicurio Registry", env_var=REGISTRY_HOME_ENV, unpack=True, folder="app")
    runner = _runner(app)
    if runner is None:
        raise JarSetupError(f"Maven unpacked Apicurio Registry into {app}, but no apicurio-registry-app-*-runner.jar "
                            "with a lib/ folder is there: check infra/registry/pom.xml's artifact")
    return runner


@dataclass
class RegistryServer(ServerProcess):
    """Apicurio Registry in ``folder`` (its log, its working directory), listening on 127.0.0.1:``port``."""

    folder: Path
    port: int
    heap: str = "-Xms64m -Xmx384m"
    runner: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (``--schema-registry``, ``SchemaRegistryClient``'s url)."""
        return f"http://{LOOPBACK}:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.folder / "registry.log"

    def start(self, timeout: float = 120.0) -> RegistryServer:
        """Start the registry and wait until its Confluent API answers (``GET /subjects``)."""
        runner = self.runner or ensure_registry_app()
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [str(find_java()), *self.heap.split(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   "-Djava.awt.headless=true", f"-Dquarkus.http.host={LOOPBACK}", f"-Dquarkus.http.port={self.port}",
                   # Its working files (imports, snapshots) in its folder, not /tmp.
                   f"-Dapicurio.import.work-dir={self.folder}", f"-Dapicurio.storage.snapshot.location={self.folder}",
                   "-jar", str(runner)]
        process = self._launch(command, self.folder)
        deadline = time.monotonic() + timeout
        while not self.answers():
            if process.poll() is not None:
                raise JarSetupError(f"Apicurio Registry exited ({process.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise JarSetupError(f"Apicurio Registry does not answer on {self.url} after {timeout:.0f} s:\n"
                                    f"{self.tail()}")
            time.sleep(0.25)
        return self

    def answers(self) -> bool:
        """True when the Confluent API answers ``GET /subjects`` with 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False
