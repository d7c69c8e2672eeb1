"""Apache Kafka for the local stack: its jars, the Java runtime, its configuration and its log folder.

The broker is Apache Kafka in KRaft mode, one process that is both broker and controller, the same
software users run in production. Nothing is downloaded outside Maven Central: ``infra/kafka/pom.xml``
names ``org.apache.kafka:kafka_2.13`` and the logging binding its pom leaves out, and Maven copies them
with their run-time dependencies into a cache folder outside the work tree (``~/.cache/mvlog/kafka-<v>``,
or ``$MVLOG_KAFKA_HOME``), reused when present. ``make setup`` resolves it; :func:`ensure_kafka_jars`
does the same on first use, so a pip-installed mvlog needs only ``mvn`` and Java.

The broker's folder under the stack folder holds everything that must survive a restart::

    kafka/
      server.properties   written at every start from the stack's ports (the controller port is kept)
      log4j2.properties   warnings to the process's stdout (logs/kafka.log)
      data/               the log directory, formatted once (kafka.tools.StorageTool format --standalone)

This module only prepares; :mod:`mvlog.infra.local_stack` starts and stops the process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mvlog.infra.maven_jars import JarSetupError, cache_folder, pom_property, resolve_jars

__all__ = [
    "DEFAULT_JVM_OPTIONS",
    "KAFKA_HEAP_ENV",
    "KAFKA_HOME_ENV",
    "KAFKA_JVM_ENV",
    "KafkaBroker",
    "KafkaSetupError",
    "ensure_kafka_jars",
    "find_java",
    "kafka_home",
    "kafka_version",
]

KAFKA_HOME_ENV = "MVLOG_KAFKA_HOME"
KAFKA_HEAP_ENV = "MVLOG_KAFKA_HEAP_OPTS"
KAFKA_JVM_ENV = "MVLOG_KAFKA_JVM_OPTS"
JAVA_MIN_MAJOR = 17
#: A laptop's heap: the broker's working set for mvlog's topics stays well under it.
DEFAULT_HEAP = "-Xms256m -Xmx768m"
#: The broker's JVM options besides its heap (``MVLOG_KAFKA_JVM_OPTS`` replaces them): short pauses for a
#: broker that runs for days. The tests' brokers, which live for minutes, add ``-XX:TieredStopAtLevel=1``:
#: the JIT's optimizing tier took a third of their CPU (tests/conftest.py).
DEFAULT_JVM_OPTIONS = "-XX:+UseG1GC -XX:MaxGCPauseMillis=20"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"

#: Settings for one laptop: one replica of everything, no rebalance delay, small buffers and few threads
#: (two cores). Loopback listeners are added by :meth:`KafkaBroker.server_properties`; a stack's own
#: ``broker_settings`` (tests: a faster retention check) come last.
LAPTOP_SETTINGS: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "8",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "num.recovery.threads.per.data.dir": "2",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "log.index.size.max.bytes": str(1024 * 1024),
    # mvlog refuses rows above 8 MiB (Settings.max_record_bytes); a change event holds two of them.
    "message.max.bytes": str(20 * 1024 * 1024),
    "replica.fetch.max.bytes": str(20 * 1024 * 1024),
    "log.retention.check.interval.ms": "60000",
}


#: The broker cannot be prepared (no Java, no Maven, no jars); the message says what to install.
KafkaSetupError = JarSetupError


def kafka_version(pom: Path = POM) -> str:
    """The Kafka version the pom names (its ``kafka.version`` property): one place to change it."""
    return pom_property(pom, "kafka.version")


def kafka_home(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the broker's jars live: ``$MVLOG_KAFKA_HOME``, else ``~/.cache/mvlog/kafka-<version>``."""
    return cache_folder(KAFKA_HOME_ENV, f"kafka-{kafka_version()}", environ)


def _libs(home: Path) -> Path:
    return home / "libs"


def _has_jars(home: Path) -> bool:
    libs = _libs(home)
    return libs.is_dir() and any(libs.glob("kafka_2.13-*.jar")) and any(libs.glob("log4j-slf4j2-impl-*.jar"))


def ensure_kafka_jars(home: Path | None = None) -> Path:
    """The folder of the broker's jars, resolved from Maven Central with ``mvn`` when not there yet."""
    home = home or kafka_home()
    if _has_jars(home):
        return _libs(home)
    find_java()  # Maven and the broker both need it: say so before a long resolution
    return resolve_jars(POM, home, what=f"Apache Kafka {kafka_version()}", env_var=KAFKA_HOME_ENV)


def find_java(environ: Mapping[str, str] = os.environ) -> Path:
    """A Java runtime >= 17 (``$JAVA_HOME/bin/java``, else ``java`` on PATH): the one Spark needs too."""
    install = "Install one, e.g. `apt-get install -y openjdk-17-jre-headless` (`make setup` does it)."
    java_home = environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is None or not candidate.is_file():
        found = shutil.which("java")
        if found is None:
            raise KafkaSetupError(f"Apache Kafka needs a Java runtime >= {JAVA_MIN_MAJOR}; none was found. "
                                  f"{install}")
        candidate = Path(found)
    done = subprocess.run([str(candidate), "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', done.stderr + done.stdout)
    if match is None or int(match.group(1)) < JAVA_MIN_MAJOR:
        raise KafkaSetupError(f"Apache Kafka needs Java >= {JAVA_MIN_MAJOR}; {candidate} is "
                              f"{(done.stderr or done.stdout).splitlines()[:1]}. {install}")
    return candidate


_LOG4J2 = """\
# Written by mvlog at every start. Warnings and errors to stdout, which the stack keeps in logs/kafka.log.
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


@dataclass
class KafkaBroker:
    """One combined broker + controller (KRaft) whose data lives in ``folder``.

    ``controller_port`` is recorded in the folder's ``server.properties`` the first time: the quorum's
    one voter is written into the formatted log with its address, so later starts must keep it.
    """

    folder: Path
    host: str
    port: int
    controller_port: int | None = None
    settings: dict[str, str] = field(default_factory=dict)
    heap: str = field(default_factory=lambda: os.environ.get(KAFKA_HEAP_ENV, DEFAULT_HEAP))
    jvm_options: str = field(default_factory=lambda: os.environ.get(KAFKA_JVM_ENV, DEFAULT_JVM_OPTIONS))

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def properties_file(self) -> Path:
        return self.folder / "server.properties"

    def is_formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()

    def recorded_controller_port(self) -> int | None:
        try:
            text = self.properties_file.read_text()
        except OSError:
            return None
        match = re.search(r"^controller\.quorum\.bootstrap\.servers=.*:(\d+)\s*$", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def server_properties(self, controller_port: int) -> dict[str, str]:
        host = self.host
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
            "listeners": f"PLAINTEXT://{host}:{self.port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir.resolve()),
            **LAPTOP_SETTINGS,
            **self.settings,
        }

    def prepare(self, java: Path, libs: Path) -> list[str]:
        """Write the configuration, format the log folder the first time, return the broker's command."""
        if self.controller_port is None:
            self.controller_port = self.recorded_controller_port()
        if self.controller_port is None:
            raise KafkaSetupError("the broker's controller port is not known (neither given nor recorded)")
        self.folder.mkdir(parents=True, exist_ok=True)
        properties = self.server_properties(self.controller_port)
        self.properties_file.write_text("# Written by mvlog at every start; edit Settings, not this file.\n"
                                        + "".join(f"{k}={v}\n" for k, v in properties.items()))
        log4j = self.folder / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        jvm = [str(java), "-cp", f"{libs}/*", f"-Dlog4j2.configurationFile={log4j.resolve()}",
               "-Djava.awt.headless=true"]
        if not self.is_formatted():
            self._format(jvm)
        return [*jvm, *self.heap.split(), *self.jvm_options.split(), "kafka.Kafka",
                str(self.properties_file.resolve())]

    def _format(self, jvm: list[str]) -> None:
        uuid = subprocess.run([*jvm, "kafka.tools.StorageTool", "random-uuid"], capture_output=True,
                              text=True, check=False)
        cluster_id = uuid.stdout.strip().splitlines()[-1] if uuid.returncode == 0 and uuid.stdout.strip() else ""
        if not cluster_id:
            raise KafkaSetupError(f"kafka.tools.StorageTool random-uuid failed: {uuid.stderr[-2000:]}")
        done = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id,
                               "-c", str(self.properties_file.resolve())],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KafkaSetupError(f"formatting the broker's log folder {self.data_dir} failed:\n"
                                  f"{(done.stdout + done.stderr)[-3000:]}")
