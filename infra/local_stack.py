"""The local stack: Apache Kafka (KRaft) and a Redis server on loopback, as plain processes, durable.

Nothing here needs Docker. The broker is Apache Kafka from Maven Central (see
:mod:`mvlog.infra.kafka_broker`), run by the Java runtime that Spark needs anyway; ``redis-server`` is
Debian's. Both bind to 127.0.0.1 and keep their pid files, logs and data in one folder
(``Settings.stack_dir``, ``.mvlog/`` by default), so ``mvlog down`` stops a stack that ``mvlog up``
started from another process, and the next ``mvlog up`` finds every topic and key again::

    .mvlog/
      stack.json          host, ports and pids of the running stack
      kafka.pid  redis.pid
      logs/kafka.log  logs/redis.log
      kafka/              the broker's configuration and log folder (formatted once)
      redis/              redis-server's working directory: its append-only file

Redis persists with its append-only file (``appendfsync everysec``): a restart then finds the control
plane and every view's state as it was, without replaying changelogs. Kafka stays the source of truth:
if the file lost its last second (a crash of the machine, not of the process, which loses nothing),
the writers and consumers roll Redis forward from their changelogs as after any Redis loss.

``start()`` starts what is missing and keeps what runs (one of the two may have died); only
``stop(purge=True)`` deletes data.

Every failure a user can fix raises a :class:`StackError` whose message says what to do: a port that
is taken (and by which process), a binary that is missing (and how to install it), a process that died
at start (with the tail of its log).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mvlog.infra.child_processes import die_with_parent, pid_alive
from mvlog.infra.kafka_broker import KafkaBroker, KafkaSetupError, ensure_kafka_jars, find_java, kafka_version

if TYPE_CHECKING:
    from mvlog.config import Settings

__all__ = [
    "BinaryNotFoundError",
    "LocalStack",
    "PortInUseError",
    "ProcessDiedError",
    "ServiceStatus",
    "StackError",
    "StartReport",
    "find_redis_server",
    "free_port",
    "free_ports",
    "port_in_use",
    "port_owner",
    "record_stack",
    "recorded_stacks",
    "user_state_file",
]

log = logging.getLogger(__name__)
# librdkafka reports every refused connection while a broker starts; the health check wants none of it.
_quiet_kafka_log = logging.getLogger(f"{__name__}.kafka")
_quiet_kafka_log.addHandler(logging.NullHandler())
_quiet_kafka_log.propagate = False

LOOPBACK = "127.0.0.1"
DEFAULT_KAFKA_PORT = 19092
DEFAULT_REDIS_PORT = 16379
STATE_FILE = "stack.json"
STACKS_FILE = "stacks.json"  # in the user's state folder: every stack `mvlog up` started (see user_state_file)

REDIS_BIN_ENV = "MVLOG_REDIS_SERVER_BIN"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class StackError(RuntimeError):
    """The local stack cannot start, stop or be reached; the message says what to do about it."""


class PortInUseError(StackError):
    def __init__(self, host: str, port: int, what: str, owner: str | None) -> None:
        self.host, self.port, self.owner = host, port, owner
        by = f" by {owner}" if owner else " by another process"
        super().__init__(
            f"port {port} on {host}, wanted for {what}, is already taken{by}. "
            f"Stop that process, or pick other ports (mvlog up --kafka-port/--redis-port, "
            f"or MVLOG_BOOTSTRAP_SERVERS / MVLOG_REDIS_URL)."
        )


class BinaryNotFoundError(StackError):
    pass


class ProcessDiedError(StackError):
    def __init__(self, what: str, detail: str, log_file: Path) -> None:
        self.log_file = log_file
        tail = _tail(log_file)
        shown = f"\n--- last lines of {log_file} ---\n{tail}" if tail else f" ({log_file} is empty)"
        super().__init__(f"{what} {detail}{shown}")


# --------------------------------------------------------------------------------------------- ports


#: Listening ports are picked at random from here up to the kernel's ephemeral range, never in it: a
#: port the kernel hands out for ``bind(0)`` is one it also hands to outgoing connections' local ends, so
#: between being picked and being bound by a server it could be taken by any client's connection (seen:
#: a broker's controller port taken while a machine ran three Spark test suites). Below the range, only
#: another listener can take it.
PORT_FLOOR = 20000


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default when it cannot be read)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now (held together, so never equal),
    below the ephemeral range when there is room (:data:`PORT_FLOOR`), else any the kernel gives.

    Another listener may still take one before it is used; tests pass them straight to the stack.
    """
    low, _ = ephemeral_ports()
    choices = random.Random(os.urandom(8))
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(sock := socket.socket(socket.AF_INET, socket.SOCK_STREAM))  # closed below
            _bind_listening_port(sock, host, low, choices)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _bind_listening_port(sock: socket.socket, host: str, ephemeral_low: int, choices: random.Random) -> None:
    """Bind ``sock`` to a free port picked at random below the ephemeral range; when that range leaves
    too little room under it (or 50 picks were taken), to any port the kernel gives."""
    if ephemeral_low - PORT_FLOOR >= 1000:
        for _ in range(50):
            try:
                sock.bind((host, choices.randrange(PORT_FLOOR, ephemeral_low)))
                return
            except OSError:
                continue
    sock.bind((host, 0))


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]


def port_in_use(host: str, port: int) -> bool:
    """True when something listens on ``host:port`` (or holds it so that a server could not bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so connections in TIME_WAIT do not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_owner(port: int) -> str | None:
    """``"pid 123 (redis-server)"`` for the process listening on TCP ``port``, when the OS tells us."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if str(fd.readlink()) in wanted:
                    return f"pid {proc.name} ({_process_name(int(proc.name))})"
        except OSError:
            continue
    return None


def _process_name(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return " ".join(part.decode(errors="replace") for part in cmdline if part)[:120] or "?"
    except OSError:
        return "?"


# ------------------------------------------------------------------------------------------ binaries


def find_redis_server(explicit: Path | None = None) -> Path:
    """``redis-server``: ``explicit``, ``$MVLOG_REDIS_SERVER_BIN``, then ``PATH``."""
    install = (
        "Install it with `apt-get install -y redis-server` (Debian/Ubuntu; `make setup` does it), "
        f"`brew install redis` (macOS), or set {REDIS_BIN_ENV} to a redis-server binary."
    )
    override = explicit or (Path(os.environ[REDIS_BIN_ENV]) if os.environ.get(REDIS_BIN_ENV) else None)
    if override is not None:
        if not _is_executable(override):
            raise BinaryNotFoundError(f"redis-server {override} does not exist or is not executable. "
                                      f"{install}")
        return override
    on_path = shutil.which("redis-server")
    if on_path is None:
        raise BinaryNotFoundError(f"redis-server was not found on PATH. {install}")
    return Path(on_path)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


# ----------------------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class ServiceStatus:
    """What ``mvlog stack-status`` shows for one process of the stack."""

    name: str
    address: str
    pid: int | None
    running: bool
    healthy: bool
    log_file: Path

    def describe(self) -> str:
        if not self.running:
            state = "stopped"
        else:
            state = f"running (pid {self.pid}), " + ("healthy" if self.healthy else "NOT answering")
        return f"{self.name:<14} {self.address:<22} {state}"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(_ANSI.sub("", line) for line in text.rstrip().splitlines()[-lines:])


@dataclass
class _Service:
    name: str  # "kafka" / "redis": pid file, log file and stack.json key
    label: str  # what the user reads
    port: int
    prepare: Callable[[], list[str]]  # finds the binary, writes the configuration, returns the command
    health: Callable[[float], bool]
    stop_timeout_s: float


@dataclass(frozen=True)
class StartReport:
    """What ``start()`` did: the services it started and those it found running and kept."""

    started: tuple[str, ...]
    kept: tuple[str, ...]


@dataclass
class LocalStack:
    """Apache Kafka + redis-server on loopback, with pid files, logs and data under ``data_dir``.

    ``start()`` launches what is not running, detached (its own session), so it outlives the caller
    unless ``die_with_parent`` is set (the test fixtures set it); ``stop()`` works from any process, from
    the pid files, and keeps the data unless asked to purge it. Use as a context manager to stop on exit.
    """

    data_dir: Path = Path(".mvlog")
    kafka_port: int = DEFAULT_KAFKA_PORT
    redis_port: int = DEFAULT_REDIS_PORT
    host: str = LOOPBACK
    #: The KRaft controller's port; None: the one recorded in the broker's folder, else kafka_port + 1
    #: (or any free port when that one is taken) the first time.
    controller_port: int | None = None
    #: Broker settings over the laptop defaults (e.g. ``log.retention.check.interval.ms``).
    broker_settings: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 90.0
    stop_timeout_s: float = 30.0
    redis_bin: Path | None = None
    kafka_home: Path | None = None
    die_with_parent: bool = False
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False, repr=False)

    # ---------------------------------------------------------------------------------- construction

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LocalStack:
        """The stack that ``settings`` point at: ports from its bootstrap servers and Redis URL."""
        values: dict[str, Any] = {
            "data_dir": settings.stack_dir,
            "kafka_port": _port_of(settings.bootstrap_servers.split(",")[0], DEFAULT_KAFKA_PORT),
            "redis_port": _port_of(settings.redis_url, DEFAULT_REDIS_PORT),
            "host": settings.bind_host,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)

    @classmethod
    def load(cls, data_dir: Path) -> LocalStack | None:
        """The stack recorded in ``data_dir/stack.json`` by an earlier ``start()``, if any."""
        state = _read_state(Path(data_dir))
        if state is None:
            return None
        return cls(
            data_dir=Path(data_dir),
            kafka_port=int(state["kafka_port"]),
            redis_port=int(state["redis_port"]),
            host=str(state.get("host", LOOPBACK)),
            controller_port=state.get("controller_port"),
        )

    # ------------------------------------------------------------------------------------ addresses

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.redis_port}/0"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def kafka_dir(self) -> Path:
        return self.data_dir / "kafka"

    @property
    def redis_dir(self) -> Path:
        return self.data_dir / "redis"

    def env(self) -> dict[str, str]:
        """The environment variables that point every mvlog process at this stack (its folder too, absolute,
        so that `mvlog down` and `stack-status` find it from any directory)."""
        return {"MVLOG_BOOTSTRAP_SERVERS": self.bootstrap_servers, "MVLOG_REDIS_URL": self.redis_url,
                "MVLOG_STACK_DIR": str(self.data_dir.resolve())}

    def settings(self, **overrides: Any) -> Settings:
        from mvlog.config import Settings

        values: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "redis_url": self.redis_url,
            "bind_host": self.host,
            "stack_dir": self.data_dir,
        }
        values.update(overrides)
        return Settings(**values)

    # ------------------------------------------------------------------------------------ lifecycle

    def _broker(self) -> KafkaBroker:
        broker = KafkaBroker(self.kafka_dir, self.host, self.kafka_port, self.controller_port,
                             dict(self.broker_settings))
        if broker.controller_port is None:
            broker.controller_port = broker.recorded_controller_port()
        if broker.controller_port is None:  # first start: next to the broker's port when that is free
            beside = self.kafka_port + 1
            broker.controller_port = beside if not port_in_use(self.host, beside) else free_port(self.host)
        self.controller_port = broker.controller_port
        return broker

    def _prepare_kafka(self) -> list[str]:
        broker = self._broker()
        try:
            return broker.prepare(find_java(), ensure_kafka_jars(self.kafka_home))
        except KafkaSetupError as error:
            raise BinaryNotFoundError(str(error)) from None

    def _prepare_redis(self) -> list[str]:
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        return [
            str(find_redis_server(self.redis_bin)),
            "--port", str(self.redis_port),
            "--bind", self.host,
            "--dir", str(self.redis_dir.resolve()),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", "",
        ]

    def _services(self) -> list[_Service]:
        return [
            _Service(
                name="kafka",
                label=f"Kafka broker (Apache Kafka {kafka_version()}) on {self.bootstrap_servers}",
                port=self.kafka_port,
                prepare=self._prepare_kafka,
                health=lambda timeout: kafka_answers(self.bootstrap_servers, timeout),
                stop_timeout_s=self.stop_timeout_s,
            ),
            _Service(
                name="redis",
                label=f"redis-server on {self.host}:{self.redis_port}",
                port=self.redis_port,
                prepare=self._prepare_redis,
                health=lambda timeout: redis_answers(self.host, self.redis_port, timeout),
                stop_timeout_s=self.stop_timeout_s,
            ),
        ]

    def start(self) -> StartReport:
        """Start whatever of Kafka and Redis is not running; return once both answer.

        A service that runs already (``mvlog up`` after one of the two died) is kept as it is, with its
        data: starting never deletes anything. Raises :class:`StackError`.
        """
        recorded = LocalStack.load(self.data_dir)
        if recorded is not None:  # ports and pids of the stack that ran from this folder win
            self.kafka_port, self.redis_port, self.host = recorded.kafka_port, recorded.redis_port, recorded.host
            self.controller_port = self.controller_port or recorded.controller_port
        pids = {s.name: s.pid for s in self.status(check_health=False) if s.running and s.pid is not None}
        services = [s for s in self._services() if s.name not in pids]
        if not services:
            raise StackError(
                f"a local stack is already running from {self.data_dir} "
                f"(kafka on {self.bootstrap_servers}, redis on {self.host}:{self.redis_port}); "
                f"stop it first with `mvlog down --stack-dir {self.data_dir}`"
            )
        for service in services:
            if port_in_use(self.host, service.port):
                raise PortInUseError(self.host, service.port, service.label, port_owner(service.port))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        # Every binary is found before anything starts, the cheapest check first.
        commands = {service.name: service.prepare() for service in sorted(services, key=lambda s: s.name != "redis")}
        if self.controller_port is not None and port_in_use(self.host, self.controller_port) and "kafka" in commands:
            raise PortInUseError(self.host, self.controller_port, "the Kafka controller",
                                 port_owner(self.controller_port))
        self._write_state(pids)
        started: list[str] = []
        try:
            for service in services:
                pids[service.name] = self._launch(service, commands[service.name])
                started.append(service.name)
                self._write_state(pids)
                self._wait_healthy(service)
        except BaseException:
            for name in started:
                self._stop_one(name)
            self._write_state({name: pid for name, pid in pids.items() if name not in started})
            raise
        log.info("local stack up: kafka %s, redis %s", self.bootstrap_servers, self.redis_url)
        return StartReport(tuple(started), tuple(name for name in pids if name not in started))

    def _launch(self, service: _Service, command: list[str]) -> int:
        log_file = self.log_dir / f"{service.name}.log"
        with log_file.open("ab") as out:
            out.write(f"--- started by mvlog at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            out.flush()
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                cwd=self.data_dir,
                start_new_session=True,
                close_fds=True,
                preexec_fn=die_with_parent() if self.die_with_parent else None,
            )
        self._children[service.name] = child
        self._pid_file(service.name).write_text(f"{child.pid}\n")
        return child.pid

    def _wait_healthy(self, service: _Service) -> None:
        log_file = self.log_dir / f"{service.name}.log"
        deadline = time.monotonic() + self.start_timeout_s
        child = self._children[service.name]
        while True:
            code = child.poll()
            if code is not None:
                raise ProcessDiedError(service.label, f"exited with code {code} while starting.", log_file)
            if service.health(1.0):
                return
            if time.monotonic() > deadline:
                raise ProcessDiedError(
                    service.label, f"did not answer within {self.start_timeout_s:.0f} s.", log_file
                )
            time.sleep(0.1)

    def stop(self, purge: bool = False) -> bool:
        """Stop both processes (SIGTERM, then SIGKILL after ``stop_timeout_s``); True if any ran.

        The data stays unless ``purge``: then the broker's log folder and Redis's append-only file go
        too (see :meth:`purge`).
        """
        stopped = False
        for name in self._expectations():
            stopped = self._stop_one(name) or stopped
        (self.data_dir / STATE_FILE).unlink(missing_ok=True)
        if purge:
            self.purge()
        return stopped

    def purge(self) -> list[Path]:
        """Delete the stack's data (every topic, every Redis key); the processes must be stopped."""
        running = [s.name for s in self.status(check_health=False) if s.running]
        if running:
            raise StackError(f"cannot purge {self.data_dir} while {', '.join(running)} run from it; "
                             f"stop the stack first (`mvlog down`)")
        deleted = [folder for folder in (self.kafka_dir, self.redis_dir) if folder.exists()]
        for folder in deleted:
            shutil.rmtree(folder)
        return deleted

    def kill(self, name: str) -> None:
        """SIGKILL one process of the stack (``"kafka"`` or ``"redis"``), as a crash would: fault tests."""
        pid = self._read_pid(name)
        if pid is None or not pid_alive(pid, self._expectations()[name]):
            raise StackError(f"{name} is not running from {self.data_dir}")
        os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pid, self._expectations()[name], self._children.get(name), 10.0):
            raise StackError(f"{name} (pid {pid}) survived SIGKILL")
        self._children.pop(name, None)

    def _stop_one(self, name: str) -> bool:
        expect = self._expectations()[name]
        pid = self._read_pid(name)
        running = pid is not None and pid_alive(pid, expect)
        if pid is not None and running:
            self._terminate(name, pid, expect)
        self._pid_file(name).unlink(missing_ok=True)
        self._children.pop(name, None)
        return running

    def _terminate(self, name: str, pid: int, expect: Sequence[str]) -> None:
        child = self._children.get(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if self._wait_gone(pid, expect, child, self.stop_timeout_s):
            return
        log.warning("%s (pid %d) did not stop within %.0f s; killing it", name, pid, self.stop_timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pid, expect, child, 5.0):
            raise StackError(f"could not stop {name} (pid {pid}); stop it by hand: kill -9 {pid}")

    @staticmethod
    def _wait_gone(
        pid: int, expect: Sequence[str], child: subprocess.Popen[bytes] | None, timeout: float
    ) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.1)
                    return True
            else:
                _reap(pid)
                if not pid_alive(pid, expect):
                    return True
                time.sleep(0.1)
        return False

    def status(self, check_health: bool = True, timeout: float = 2.0) -> list[ServiceStatus]:
        addresses = {"kafka": self.bootstrap_servers, "redis": f"{self.host}:{self.redis_port}"}
        checks: dict[str, Callable[[float], bool]] = {
            "kafka": lambda t: kafka_answers(self.bootstrap_servers, t),
            "redis": lambda t: redis_answers(self.host, self.redis_port, t),
        }
        result = []
        for name, expect in self._expectations().items():
            pid = self._read_pid(name)
            running = pid is not None and pid_alive(pid, expect)
            healthy = running and check_health and checks[name](timeout)
            result.append(ServiceStatus(name, addresses[name], pid if running else None, running,
                                        healthy, self.log_dir / f"{name}.log"))
        return result

    def is_running(self) -> bool:
        return all(s.running for s in self.status(check_health=False))

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -------------------------------------------------------------------------------------- records

    def _expectations(self) -> dict[str, tuple[str, ...]]:
        """What each process's command line holds: a recycled pid is never taken for ours."""
        return {"kafka": ("kafka.Kafka", str((self.kafka_dir / "server.properties").resolve())),
                "redis": (f":{self.redis_port}",)}

    def _pid_file(self, name: str) -> Path:
        return self.data_dir / f"{name}.pid"

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self._pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _write_state(self, pids: dict[str, int]) -> None:
        state = {
            "host": self.host,
            "kafka_port": self.kafka_port,
            "controller_port": self.controller_port,
            "redis_port": self.redis_port,
            "bootstrap_servers": self.bootstrap_servers,
            "redis_url": self.redis_url,
            "pids": pids,
            "started_at": time.time(),
        }
        path = self.data_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def user_state_file() -> Path:
    """The user's record of the stacks `mvlog up` started: ``$XDG_STATE_HOME/mvlog/stacks.json``
    (``~/.local/state/mvlog/stacks.json`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "mvlog" / STACKS_FILE


def recorded_stacks() -> list[LocalStack]:
    """The stacks of :func:`user_state_file` that still have their ``stack.json`` (not stopped since)."""
    try:
        folders = json.loads(user_state_file().read_text())
    except (OSError, ValueError):
        return []
    found = [LocalStack.load(Path(folder)) for folder in folders] if isinstance(folders, list) else []
    return [stack for stack in found if stack is not None]


def record_stack(data_dir: Path, *, forget: bool = False) -> None:
    """Add the stack in ``data_dir`` to :func:`user_state_file` (or remove it); stacks stopped since
    are dropped from it on the way."""
    folder = str(Path(data_dir).resolve())
    kept = [str(stack.data_dir) for stack in recorded_stacks() if str(stack.data_dir) != folder]
    path = user_state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(kept if forget else [*kept, folder], indent=2) + "\n")
    tmp.replace(path)


def _port_of(address: str, default: int) -> int:
    match = re.search(r":(\d+)(?:/|$)", address.strip())
    return int(match.group(1)) if match else default


# -------------------------------------------------------------------------------------- health checks


def kafka_answers(bootstrap_servers: str, timeout: float = 2.0) -> bool:
    """True when a Kafka-protocol broker at ``bootstrap_servers`` answers a metadata request."""
    host, _, port = bootstrap_servers.split(",")[0].rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # cheap, and keeps librdkafka quiet
        probe.settimeout(timeout)
        if probe.connect_ex((host, int(port))) != 0:
            return False
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": _quiet_kafka_log,
                              "socket.timeout.ms": max(1000, int(timeout * 1000))}
    admin = AdminClient(config)
    try:
        return bool(admin.list_topics(timeout=timeout).brokers)
    except Exception:
        return False


def redis_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when a Redis server at ``host:port`` answers PING."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def wait_until(check: Callable[[], bool], timeout: float, what: str, pause: float = 0.2) -> None:
    """Poll ``check`` until it is true; raise :class:`StackError` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise StackError(f"{what} did not become ready within {timeout:.0f} s")
        time.sleep(pause)

