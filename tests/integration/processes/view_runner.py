"""Runs Spark consumers of views in their own process, so a test can SIGKILL them at random points.

Usage: python -m tests.integration.processes.view_runner [--standby] SETTINGS_JSON VIEW [VIEW ...]
With ``--standby`` it starts its Spark session, prints ``standby`` and waits for a line on stdin before
it makes the consumers: a SIGKILL test starts the next consumer process while the last one runs, so that
each kill does not wait for a JVM's start (the recovery, what the test is about, begins at that line).
Prints ``ready <views in tasks>`` once the streaming queries run (the views whose operators run in Spark's
tasks, comma-separated, or ``-``), then ``mce <view> <epoch>`` as epochs commit, and
``chunk <vnode> <start>`` for each vnode of each backfill chunk read (start: the position in hex, ``-``).
Exits with an error as soon as a consumer's micro-batch fails to apply.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from mvlog.backfill import Chunk
from mvlog.config import Settings
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.spark.session import spark_session

ROOT = Path(__file__).resolve().parents[3]

#: How long a SIGKILL test waits for a consumer process's ``ready`` (the backlog of every view read with
#: batch jobs: 15-20 s on a quiet machine, over 120 s in a loaded CI run) and for its next ``mce``.
READY_TIMEOUT_S = 300.0
MCE_TIMEOUT_S = 120.0


def spawn(settings: Settings, views: list[str], *, standby: bool = False,
          log: Path | None = None) -> subprocess.Popen[str]:
    """This runner in a child process for ``views``; its stdout is a pipe of the lines above (``standby``:
    it waits, once its Spark session runs, for a line on stdin: :meth:`Relay.next` sends it). Its stderr
    (Spark's log, tracebacks) goes to ``log`` when given."""
    # ROOT first for the runner; the caller's PYTHONPATH stays (e.g. a worktree's package over the installed one).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable}
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "tests.integration.processes.view_runner",
                                 *(["--standby"] if standby else []), settings.model_dump_json(), *views],
                                stdin=subprocess.PIPE if standby else None, stdout=subprocess.PIPE,
                                stderr=stderr, text=True, cwd=ROOT, env=env)


class Lines:
    """A consumer process's stdout, read line by line by a thread of its own: a wait for a line then
    times out even while the process prints nothing (a blocked ``readline`` would not), and what it printed
    before a SIGKILL can still be read."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        self.child = child
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(child.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stdout: object) -> None:
        for line in stdout:  # type: ignore[attr-defined]
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # end of output: the process exited (or closed its stdout)

    def until(self, prefix: str, timeout: float, sink: list[str] | None = None) -> str:
        """The next line starting with ``prefix``; the lines before it (and it) are added to ``sink``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} within {timeout} s (the consumer process "
                                     f"{'runs' if self.child.poll() is None else 'exited'})") from None
            if line is None:
                self._lines.put(None)
                raise AssertionError(f"the consumer process exited ({self.child.poll()}) before printing {prefix!r}")
            if sink is not None:
                sink.append(line)
            if line.startswith(prefix):
                return line

    def rest(self) -> list[str]:
        """Every line not read yet, once the process has exited."""
        self._reader.join(30)
        lines = []
        while not self._lines.empty():
            if (line := self._lines.get_nowait()) is not None:
                lines.append(line)
        return lines


class Relay:
    """The consumer processes of a SIGKILL test, one after another: each starts its Spark session
    (``standby``) while the one before it runs, and makes its consumers when it takes over (:meth:`next`).
    A kill then costs the recovery the test is about, not a JVM's start on top of it. ``runs``: how many
    take over in all (no process is started that none needs). ``log_dir``: where each process's stderr
    goes (``consumer-<n>.log``); when the block fails, the last lines of each are printed for the report."""

    def __init__(self, settings: Settings, views: list[str], runs: int, log_dir: Path | None = None) -> None:
        self.settings, self.views, self._left, self._log_dir = settings, views, runs, log_dir
        self._spawned: list[subprocess.Popen[str]] = []
        self._waiting: subprocess.Popen[str] | None = None
        self._start()

    def next(self, timeout: float = 180.0) -> Lines:
        """The next consumer process, told to go on (its stdout then prints ``ready`` and so on)."""
        taking = self._waiting
        assert taking is not None and taking.stdin is not None, "every run has taken over already"
        self._waiting = None
        lines = Lines(taking)
        lines.until("standby", timeout)  # its Spark session runs
        taking.stdin.write("go\n")
        taking.stdin.flush()
        self._start()
        return lines

    def _start(self) -> None:
        if self._left > 0:
            self._left -= 1
            log = None if self._log_dir is None else self._log_dir / f"consumer-{len(self._spawned)}.log"
            self._waiting = spawn(self.settings, self.views, standby=True, log=log)
            self._spawned.append(self._waiting)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, failed: type[BaseException] | None, *_: object) -> None:
        if failed is not None and self._log_dir is not None:
            for n, child in enumerate(self._spawned):
                if child.poll() is None:
                    _dump_stacks(child, self._log_dir / f"consumer-{n}")
        for child in self._spawned:  # a test that fails leaves some running, and one waiting
            if child.poll() is None:
                child.kill()
                child.wait()
        if failed is not None and self._log_dir is not None:
            for log in sorted(self._log_dir.glob("consumer-*.log")):
                tail = log.read_text(errors="replace").splitlines()[-150:]
                print(f"--- the last lines of {log.name} ---", *tail, sep="\n")


def _dump_stacks(child: subprocess.Popen[str], log: Path) -> None:
    """Where a consumer process that the test gave up on is: its Python threads' stacks (``SIGUSR1``: the
    runner's ``faulthandler`` writes them to its log) and, in ``<log>.jstack-<pid>``, each JVM's below it
    (the Spark driver's, a local cluster's executors'); the driver's streaming threads are printed too."""
    try:
        os.kill(child.pid, signal.SIGUSR1)
        below = psutil.Process(child.pid).children(recursive=True)
    except (ProcessLookupError, psutil.Error):
        return  # it exited meanwhile
    for process in below:
        try:
            if process.name() != "java":
                continue
            dump = subprocess.run(["jstack", str(process.pid)], capture_output=True, text=True, timeout=30).stdout
        except (psutil.Error, OSError, subprocess.TimeoutExpired):
            continue
        Path(f"{log}.jstack-{process.pid}").write_text(dump)
        for thread in dump.split("\n\n"):
            if "stream execution thread" in thread:
                print(f"--- {log.name}: JVM {process.pid} ---", "\n".join(thread.splitlines()[:40]), sep="\n")
    time.sleep(1)  # faulthandler's dump


def _print_chunk(chunk: Chunk) -> None:
    for part in chunk.vnodes:
        start = "-" if part.start.last is None else part.start.last.hex()
        print(f"chunk {part.vnode} {start}", flush=True)


def _phase(began: float, what: str) -> None:
    """A line on stderr (the consumer's log, read when a test fails): where the start's time went."""
    print(f"view_runner +{time.monotonic() - began:.1f}s {what}", file=sys.stderr, flush=True)


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that gives up on this process: _dump_stacks
    args = sys.argv[1:]
    standby = args[0] == "--standby"
    settings = Settings.model_validate_json(args[1 if standby else 0])
    spark = None
    if standby:
        spark = spark_session(settings, app_name="mvlog-standby")
        spark.range(1).count()  # the first job's start too
        print("standby", flush=True)
        if not sys.stdin.readline():
            return  # the test ended without it
    consumers: list[ViewConsumer] = []
    began = time.monotonic()
    for view in args[2 if standby else 1:]:
        spark = consumers[0].spark if consumers else spark
        consumers.append(ViewConsumer(settings, view, spark=spark, max_epochs_per_trigger=20,
                                      trigger_interval="100 milliseconds"))
        _phase(began, f"{view}: consumer made")
    for consumer in consumers:
        if consumer.backfill is not None:
            consumer.backfill.on_chunk_read = _print_chunk
        consumer.start()
        _phase(began, f"{consumer.entry.name}: started at MCE {consumer.mce}")
    in_tasks = ",".join(c.entry.name for c in consumers if c.tasks is not None) or "-"
    print(f"ready {in_tasks}", flush=True)  # the views whose operators run in Spark's tasks
    reported = {c.entry.name: c.mce for c in consumers}
    while True:
        for consumer in consumers:
            if (error := consumer.failure()) is not None:  # the query itself fails only at its next micro-batch
                raise SystemExit(f"{consumer.entry.name}: a micro-batch failed: {error!r}")
            if consumer.mce != reported[consumer.entry.name]:
                reported[consumer.entry.name] = consumer.mce
                print(f"mce {consumer.entry.name} {consumer.mce}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
