"""Kafka Connect (standalone) with Debezium's PostgreSQL connector: a real CDC pipeline on loopback.

The jars come from Maven Central only: ``infra/connect/pom.xml`` names ``connect-runtime`` and
``connect-json`` (the broker's Kafka version, read from ``infra/kafka/pom.xml`` and passed to Maven, so
the worker never differs from the broker) and ``io.debezium:debezium-connector-postgres``; Maven copies
them with their run-time dependencies into ``~/.cache/mvlog/connect-<kafka>-debezium-<debezium>`` (or
``$MVLOG_CONNECT_HOME``), reused when present. ``make setup`` resolves it (:func:`ensure_connect_jars`).

:class:`ConnectWorker` runs ``org.apache.kafka.connect.cli.ConnectStandalone`` with one connector, its
REST listener on loopback, its source offsets in a file of its folder (so a restarted worker resumes
where the last *flushed* offsets say: Debezium then redelivers what came after, at least once). The
tests use it to feed mvlog a Debezium topic written by Debezium itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mvlog.infra.child_processes import ServerProcess
from mvlog.infra.kafka_broker import find_java, kafka_version
from mvlog.infra.maven_jars import JarSetupError, cache_folder, pom_property, resolve_jars

__all__ = ["CONNECT_HOME_ENV", "ConnectWorker", "connect_home", "debezium_postgres_connector",
           "debezium_version", "ensure_connect_jars"]

CONNECT_HOME_ENV = "MVLOG_CONNECT_HOME"
POM = Path(__file__).resolve().parent / "connect" / "pom.xml"
LOOPBACK = "127.0.0.1"


def debezium_version(pom: Path = POM) -> str:
    """The Debezium version the pom names (its ``debezium.version`` property)."""
    return pom_property(pom, "debezium.version")


def connect_home(environ: Mapping[str, str] = os.environ) -> Path:
    """``$MVLOG_CONNECT_HOME``, else ``~/.cache/mvlog/connect-<kafka>-debezium-<debezium>``."""
    return cache_folder(CONNECT_HOME_ENV, f"connect-{kafka_version()}-debezium-{debezium_version()}", environ)


def _has_jars(libs: Path) -> bool:
    return (libs.is_dir() and any(libs.glob("connect-runtime-*.jar"))
            and any(libs.glob("debezium-connector-postgres-*.jar")) and any(libs.glob("log4j-slf4j2-impl-*.jar")))


def ensure_connect_jars(home: Path | None = None) -> Path:
    """The folder of Kafka Connect's and Debezium's jars, resolved with ``mvn`` when not there yet (Connect
    at the broker's Kafka version)."""
    home = home or connect_home()
    libs = home / "libs"
    if _has_jars(libs):
        return libs
    find_java()
    return resolve_jars(POM, home, what="Kafka Connect / Debezium", env_var=CONNECT_HOME_ENV,
                        properties={"kafka.version": kafka_version()})


def debezium_postgres_connector(name: str, *, host: str, port: int, user: str, database: str,
                                topic_prefix: str, tables: list[str], slot: str) -> dict[str, str]:
    """The properties of Debezium's PostgreSQL connector reading ``tables`` (``schema.table``) through
    ``pgoutput`` (built into PostgreSQL >= 10: no server plugin to install) into ``<topic_prefix>.<schema>.
    <table>``. A publication of just those tables is created by the connector (``filtered``)."""
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": "unused",  # trust authentication on loopback
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "slot.name": slot,
        "publication.name": f"{slot}_pub",
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "decimal.handling.mode": "double",
        "tombstones.on.delete": "true",
    }


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.dbz.name = io.debezium
logger.dbz.level = info
"""


@dataclass
class ConnectWorker(ServerProcess):
    """A Kafka Connect standalone worker in ``folder`` running one connector (``connector`` properties).

    ``schemas`` sets the JSON converter's ``schemas.enable`` for keys and values; ``flush_ms`` is how
    often source offsets are written to the offsets file (what a SIGKILLed worker resumes from).
    """

    folder: Path
    bootstrap_servers: str
    rest_port: int
    connector: dict[str, str]
    schemas: bool = False
    flush_ms: int = 1000
    heap: str = "-Xms128m -Xmx512m"
    libs: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def offsets_file(self) -> Path:
        return self.folder / "connect.offsets"

    @property
    def log_file(self) -> Path:
        return self.folder / "connect.log"

    def _write_config(self) -> tuple[Path, Path, Path]:
        self.folder.mkdir(parents=True, exist_ok=True)
        enabled = "true" if self.schemas else "false"
        worker = {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": enabled,
            "value.converter.schemas.enable": enabled,
            "offset.storage.file.filename": str(self.offsets_file),
            "offset.flush.interval.ms": str(self.flush_ms),
            "listeners": f"http://{LOOPBACK}:{self.rest_port}",
            "rest.advertised.host.name": LOOPBACK,
            # The connectors are on the class path (one folder of jars); nothing to scan.
            "plugin.discovery": "service_load",
            "producer.linger.ms": "5",
        }
        worker_file, connector_file, log4j = (self.folder / "worker.properties", self.folder / "connector.properties",
                                              self.folder / "log4j2.properties")
        worker_file.write_text("".join(f"{k}={v}\n" for k, v in worker.items()))
        connector_file.write_text("".join(f"{k}={v}\n" for k, v in self.connector.items()))
        log4j.write_text(_LOG4J2)
        return worker_file, connector_file, log4j

    def start(self, timeout: float = 90.0) -> ConnectWorker:
        """Start the worker and wait until its connector's task runs (REST ``/status``)."""
        libs = self.libs or ensure_connect_jars()
        worker_file, connector_file, log4j = self._write_config()
        command = [str(find_java()), *self.heap.split(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   "-cp", f"{libs}/*", f"-Dlog4j2.configurationFile={log4j}", "-Djava.awt.headless=true",
                   "org.apache.kafka.connect.cli.ConnectStandalone", str(worker_file), str(connector_file)]
        process = self._launch(command, self.folder)
        deadline = time.monotonic() + timeout
        while (state := self.task_state()) != "RUNNING":
            if process.poll() is not None:
                raise JarSetupError(f"Kafka Connect exited ({process.returncode}):\n{self.tail()}")
            if state == "FAILED" or time.monotonic() > deadline:
                self.kill()
                raise JarSetupError(f"Debezium's task is {state} after {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.3)
        return self

    def task_state(self) -> str | None:
        """The state of the connector's first task as the REST API reports it (None: not answering yet)."""
        url = f"http://{LOOPBACK}:{self.rest_port}/connectors/{self.connector['name']}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                status = json.load(answer)
        except (OSError, ValueError):
            return None
        tasks = status.get("tasks") or []
        return str(tasks[0]["state"]) if tasks else None

