"""Children that do not outlive whoever started them.

The local stack, the soak and the test fixtures start brokers, databases and pipeline processes. When the
starting process is SIGKILLed (a test's timeout, an operator's Ctrl-\\), its children would otherwise run on
as orphans holding ports and CPU: Linux's parent-death signal ends them instead. :func:`pid_alive` tells
whether a process recorded by pid (a pid file, a folder's name) still runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that has Linux send ``sig`` to the child when its parent
    dies; ``None`` (nothing to do) elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return arm


class ServerProcess:
    """A server the tests run as a child (a JVM: Kafka Connect, the schema registry), logging to
    :attr:`log_file`: the log's tail for error messages, and a stop that asks before it kills.
    Subclasses (dataclasses) hold ``process`` and define :meth:`start`."""

    process: subprocess.Popen[bytes] | None

    @property
    def log_file(self) -> Path:
        raise NotImplementedError

    def start(self) -> Self:
        raise NotImplementedError

    def _launch(self, command: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        """Start ``command`` in ``cwd``, its output appended to :attr:`log_file`, ended with its parent."""
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                            preexec_fn=die_with_parent())
        return self.process

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no clean shutdown (what a crash does)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the server shuts down cleanly), SIGKILL after ``timeout``."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int, expect: Sequence[str] = ()) -> bool:
    """True when ``pid`` runs and (where /proc tells) its command line holds every string in ``expect``.

    The check on the command line keeps a recycled pid (a stale pid file) from being mistaken for ours.
    """
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):  # a zombie has exited already
            return False
        return all(part in cmdline for part in expect)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
