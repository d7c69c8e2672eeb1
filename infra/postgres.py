"""A throw-away PostgreSQL server on loopback, for the tests' real CDC pipeline (Debezium reads its WAL).

Debian's ``postgresql`` package (``make setup`` installs it when missing) puts ``initdb`` and
``postgres`` under ``/usr/lib/postgresql/<major>/bin``, off PATH; :func:`find_postgres_bin` looks on
PATH first, then there. :class:`PostgresServer` runs ``initdb`` into a fresh folder and starts
``postgres`` as a child process on a given loopback port, TCP only (no Unix socket: nothing is left in
``/var/run/postgresql``), with ``wal_level=logical`` so Debezium's ``pgoutput`` replication slot works.

PostgreSQL refuses to run as root. Under root (CI, containers) the server runs as the ``postgres``
account the Debian package creates, in a folder under the system temp directory that this account can
reach (pytest's own temp folders are private to root).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mvlog.infra.child_processes import die_with_parent

__all__ = ["PostgresError", "PostgresServer", "find_postgres_bin"]

LOOPBACK = "127.0.0.1"
#: Superuser the tests connect as (trust authentication on loopback only).
SUPERUSER = "mvlog"


class PostgresError(RuntimeError):
    """PostgreSQL cannot be found or started; the message says what to install or what it printed."""


def find_postgres_bin(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """The folder holding ``initdb`` and ``postgres``: ``$MVLOG_PG_BIN``, PATH, else the newest
    ``/usr/lib/postgresql/<major>/bin`` (where Debian's package puts them)."""
    env = os.environ if environ is None else environ
    if env.get("MVLOG_PG_BIN"):
        return Path(env["MVLOG_PG_BIN"])
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(on_path).resolve().parent
    majors = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                    key=lambda p: int(re.sub(r"\D", "", p.parent.parent.name) or 0))
    if majors:
        return majors[-1].parent
    raise PostgresError("PostgreSQL's initdb and postgres are not installed: `apt-get install -y postgresql` "
                        "(`make setup` does it), or set MVLOG_PG_BIN to the folder that holds them")


def _run_as(account: pwd.struct_passwd | None) -> Callable[[], None]:
    """The child's pre-exec: die with the parent, and drop root to ``account`` when given."""
    arm = die_with_parent()

    def preexec() -> None:  # pragma: no cover - runs in the child
        if arm is not None:
            arm()
        if account is not None:
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
    return preexec


@dataclass
class PostgresServer:
    """One PostgreSQL server in its own folder (created under ``parent``, deleted by :meth:`stop`).

    ``settings`` are extra ``-c name=value`` options (they win over the defaults below).
    """

    port: int
    parent: Path | None = None
    settings: dict[str, str] = field(default_factory=dict)
    database: str = "mvlog"

    def __post_init__(self) -> None:
        self.bin = find_postgres_bin()
        self.account = self._account()
        self.folder = Path(tempfile.mkdtemp(prefix="mvlog-pg-", dir=self.parent))
        self.data_dir = self.folder / "data"
        self.log_file = self.folder / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _account() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresError("PostgreSQL refuses to run as root and there is no 'postgres' account "
                                "(Debian's postgresql package creates it): run as another user") from None

    @property
    def dsn(self) -> str:
        """A libpq connection string (psycopg, psql) for the superuser on the test database."""
        return f"host={LOOPBACK} port={self.port} user={SUPERUSER} dbname={self.database}"

    def _chown(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, check=False,
                              preexec_fn=_run_as(self.account), cwd=self.folder)

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """initdb (trust on loopback, superuser ``mvlog``), start ``postgres``, create the database."""
        self._chown(self.folder)
        done = self._command(str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                             "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
        if done.returncode != 0:
            raise PostgresError(f"initdb failed:\n{(done.stdout + done.stderr)[-3000:]}")
        options = {
            "listen_addresses": LOOPBACK, "port": str(self.port), "unix_socket_directories": "",
            "wal_level": "logical", "max_wal_senders": "4", "max_replication_slots": "4",
            # A test server: durability is not what it is for, start and commit speed are.
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "shared_buffers": "32MB", "max_connections": "20", "log_min_messages": "warning",
            **self.settings,
        }
        command = [str(self.bin / "postgres"), "-D", str(self.data_dir)]
        for name, value in options.items():
            command += ["-c", f"{name}={value}"]
        log = self.log_file.open("ab")
        try:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                            preexec_fn=_run_as(self.account))
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._accepts():
            if self.process.poll() is not None:
                raise PostgresError(f"postgres exited ({self.process.returncode}):\n{self._tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PostgresError(f"postgres did not accept connections in {timeout:.0f} s:\n{self._tail()}")
            time.sleep(0.1)
        done = self._command(str(self.bin / "createdb") if (self.bin / "createdb").exists() else "createdb",
                             "-h", LOOPBACK, "-p", str(self.port), "-U", SUPERUSER, self.database)
        if done.returncode != 0:
            self.stop()
            raise PostgresError(f"createdb failed: {done.stderr.strip()}")
        return self

    def _accepts(self) -> bool:
        """The server answers on its port and has finished starting (pg_isready's meaning)."""
        try:
            with socket.create_connection((LOOPBACK, self.port), 0.5):
                pass
        except OSError:
            return False
        ready = self.bin / "pg_isready"
        if not ready.exists():
            return True
        done = subprocess.run([str(ready), "-h", LOOPBACK, "-p", str(self.port), "-U", SUPERUSER, "-q"],
                              check=False)
        return done.returncode == 0

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, close connections), then delete the folder."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
