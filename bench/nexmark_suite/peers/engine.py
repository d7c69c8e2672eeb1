"""The part every peer runner shares: run an engine's job as a child process and measure it from outside.

A peer's job is the stand-alone script ``jobs/<engine>_job.py``, run by the interpreter of the engine's
own venv with the command line every job takes (:meth:`SubprocessPeer.command`). The job prints
``MVLOG-PEER-READY`` (to its log) once its engine is up and just before it starts the query: the
catch-up clock starts when the parent sees that line, so the JVM's or interpreter's start is left out and
the query's start (job submission, first micro-batch, consumer group join) is counted; the launch-to-ready
seconds are reported beside it.

For each :class:`~.base.PeerJob`:

1. **Catch-up**: the oracle (DuckDB over the input records, read from the topics before any clock) gives
   the expected final result; a fresh output topic is tailed (:class:`~.measure.OutputTail`); the job
   starts on the filled topics; the clock stops when the output equals the expected result (checked for
   2 s more). An output that never equals it is reported with its difference, timed to its last record.
2. **Steady** (when ``job.steady``): a second job on the empty steady topics; once it runs (Flink: its
   first checkpoint completed; Spark: its first micro-batch committed; engines that do not show it:
   ``settle_s`` after the READY line), the
   generator's ``produce()`` paces its events; the tail reads inputs and output; the latency of each
   counted event is the time from its produce call to the receipt of the first committed output row that
   reflects it (:func:`~.measure.latencies`), once the output equals the oracle's over the steady input.

The child runs in a session of its own, dies with its parent, and is ended (its whole process group:
JVMs, Python workers) when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mvlog.infra.child_processes import die_with_parent

from .base import PeerJob, PeerResult, percentile
from .measure import OutputTail, ensure_topic, latencies, read_topics
from .queries import QUERIES, PeerQuery, oracle_rows
from .venvs import ensure_venv

JOBS = Path(__file__).resolve().parent / "jobs"
READY = "MVLOG-PEER-READY"


class JobProcess:
    """An engine's job as a child process (own session, dies with its parent), its output in ``log``."""

    def __init__(self, command: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._log_file: IO[bytes] = log.open("wb")
        self.launched = time.time()
        self.process = subprocess.Popen(list(command), stdout=self._log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=die_with_parent(signal.SIGKILL), env=env)

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> float:
        """Wall-clock time at which the job's READY line appeared; an error with the log's tail if the job
        ended or took longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY in self.log.read_text(errors="replace"):
                return time.time()
            if not self.alive():
                break
            time.sleep(0.05)
        state = "ended" if not self.alive() else f"was not ready after {timeout:.0f} s"
        raise RuntimeError(f"the peer job {state}; its log ({self.log}) ends:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """End the job's whole process group (SIGTERM, then SIGKILL after 10 s)."""
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            except ProcessLookupError:
                pass
        else:  # the leader is gone; its group may not be
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self._log_file.close()


@dataclass
class Phase:
    """What one job run measured."""

    seconds: float | None  # ready -> output complete (None: never equal to the expected result)
    ready_s: float  # launch -> ready
    running_s: float | None  # ready -> the engine shows the query running (None: it does not show it)
    output_records: int
    tail_lag_s: float | None  # receipt of the completing output - its broker append time (commit wait + tail lag)
    final_rows: list[dict[str, Any]]
    difference: str  # "" when the output equals the oracle's result
    tail: OutputTail


class _RunningWatch(threading.Thread):
    """Notes when the peer's ``running(run_dir)`` first says yes (polled every 50 ms until stopped)."""

    def __init__(self, peer: SubprocessPeer, run_dir: Path) -> None:
        super().__init__(name=f"peer-running-{run_dir.name}", daemon=True)
        self.peer, self.run_dir = peer, run_dir
        self.running_at: float | None = None
        self.shows = peer.running(run_dir) is not None
        self._stopping = threading.Event()
        self._seen = threading.Event()
        if self.shows:
            self.start()

    def run(self) -> None:
        while not self._stopping.is_set():
            if self.peer.running(self.run_dir):
                self.running_at = time.time()
                self._seen.set()
                return
            self._stopping.wait(0.05)

    def wait(self, timeout: float) -> float | None:
        """When the query runs (None when the engine does not show it); an error after ``timeout``."""
        if not self.shows:
            return None
        if not self._seen.wait(timeout):
            raise RuntimeError(f"the peer job in {self.run_dir} was not running after {timeout:.0f} s")
        return self.running_at

    def stop(self) -> float | None:
        self._stopping.set()
        if self.is_alive():
            self.join(5)
        return self.running_at


class SubprocessPeer:
    """A :class:`~.base.PeerRunner` whose engine runs ``jobs/<engine>_job.py`` in its own venv."""

    name = ""  # as printed in the table
    engine = ""  # venv / job script name
    guarantee = ""
    settings = ""  # the configuration that gives the guarantee, printed in the note
    queries: tuple[str, ...] = ()
    ready_timeout_s = 300.0
    # The steady producer starts this long after the job says it is ready: the consumer group's join, the
    # first micro-batch or the job's deployment happen after that line, and events produced before them
    # measure the start-up, not the engine (the generator's warm-up events are not counted either).
    settle_s = 5.0

    def supports(self, query: str) -> str | None:
        if query in self.queries:
            return None
        if query in QUERIES:
            return f"{query} is not implemented for {self.name} yet"
        return f"the peers run {', '.join(QUERIES)}; {query} is not among them"

    def encoding(self, query: PeerQuery) -> str:
        """How the job encodes the query's output (see :mod:`.measure`)."""
        return "upsert" if query.updating else "append"

    def running(self, run_dir: Path) -> bool | None:
        """Whether the job's query is running (its tasks deployed), when the engine shows it; None when it
        does not."""
        return None

    def renames(self, query: PeerQuery) -> dict[str, str]:
        """Output columns the job names otherwise (a name the engine reserves) -> the query's names."""
        return {}

    def extra_args(self, job: PeerJob, run_dir: Path) -> list[str]:
        """Engine-specific arguments (jars, ...)."""
        return []

    def env(self, job: PeerJob) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
            env.pop(name, None)  # mvlog's venv is not the job's
        return env

    def command(self, job: PeerJob, topics: Any, output_topic: str, run_dir: Path) -> list[str]:
        python = ensure_venv(self.engine)
        return [str(python), str(JOBS / f"{self.engine}_job.py"), "--query", job.query,
                "--bootstrap", job.bootstrap, "--person", topics.person, "--auction", topics.auction,
                "--bid", topics.bid, "--output", output_topic, "--workdir", str(run_dir),
                "--parallelism", str(job.parallelism), "--group", f"peer-{self.engine}-{run_dir.name}",
                *self.extra_args(job, run_dir)]

    def note(self, job: PeerJob) -> str:
        return (f"{self.settings}; parallelism {job.parallelism}; catch-up timed from the job's start of the query "
                "(engine start-up excluded) to the committed output equal to DuckDB's result")

    # ------------------------------------------------------------------------------------------- runs

    def _phase(self, job: PeerJob, query: PeerQuery, topics: Any, label: str, *,
               produce: Any = None) -> tuple[Phase, list[float]]:
        run_dir = job.work_dir / f"{self.engine}-{job.query}-{label}-{uuid.uuid4().hex[:6]}"
        run_dir.mkdir(parents=True)
        inputs = {table: topics.topic_of(table) for table in query.inputs}
        for topic in topics.all():
            ensure_topic(job.bootstrap, topic, topics.partitions)
        output_topic = f"peer-out-{run_dir.name}"
        # The broker stamps output records with their append time (details: how far the tail lagged).
        ensure_topic(job.bootstrap, output_topic, job.parallelism, config={"message.timestamp.type": "LogAppendTime"})
        expected = None if produce is not None else oracle_rows(query, read_topics(job.bootstrap, inputs))
        tail = OutputTail(job.bootstrap, query, output_topic, self.encoding(query),
                          inputs if produce is not None else None, self.renames(query))
        tail.start()
        process: JobProcess | None = None
        try:
            tail.wait_assigned()
            if expected is not None:
                tail.expect(expected)
            process = JobProcess(self.command(job, topics, output_topic, run_dir), run_dir / "job.log",
                                 self.env(job))
            ready = process.wait_ready(self.ready_timeout_s)
            watch = _RunningWatch(self, run_dir)
            samples: list[float] = []
            if produce is not None:
                if watch.wait(self.ready_timeout_s) is None:
                    time.sleep(self.settle_s)  # the engine does not show when it runs
                produced = produce()
                cutoff = (produced.produce_times[produced.warmup_events]
                          if produced.warmup_events < len(produced.produce_times) else float("inf"))
                tail.expect(oracle_rows(query, read_topics(job.bootstrap, inputs)))
            done = tail.wait_result(time.time() + job.timeout_s, alive=process.alive,
                                    starting=lambda: watch.shows and watch.running_at is None)
            if done is None and not process.alive():
                raise RuntimeError(f"the {self.name} job ended early; its log ({process.log}) ends:\n{process.tail()}")
            if produce is not None:
                with tail.lock:
                    samples = latencies(query, list(tail.input_events), list(tail.outputs), cutoff)
            finished = done if done is not None else (tail.last_output_at or time.time())
            running_at = watch.stop()
            phase = Phase(seconds=None if done is None else finished - ready, ready_s=ready - process.launched,
                          running_s=None if running_at is None else running_at - ready,
                          output_records=tail.output_records, final_rows=tail.final_rows(),
                          tail_lag_s=(None if done is None or tail.matched_appended_at is None
                                      else done - tail.matched_appended_at),
                          difference="" if done is not None else
                          f"{tail.difference()}; the job's log ends: {process.tail(600)!r}", tail=tail)
            return phase, samples
        finally:
            if process is not None:
                process.stop()
            tail.stop()

    def run(self, job: PeerJob) -> PeerResult:
        unsupported = self.supports(job.query)
        if unsupported is not None:
            return PeerResult(self.name, job.query, None, None, None, self.guarantee, None, note=unsupported)
        query = QUERIES[job.query]
        catch_up, _ = self._phase(job, query, job.topics, "catchup")
        details: dict[str, Any] = {"catch_up_ready_s": round(catch_up.ready_s, 2),
                                   "catch_up_output_records": catch_up.output_records}
        if catch_up.running_s is not None:
            # READY -> the engine's first commit (Flink: first checkpoint, so the job was deployed; Spark: first
            # micro-batch, which in a catch-up holds most of the backlog).
            details["catch_up_first_commit_s"] = round(catch_up.running_s, 2)
        note = self.note(job)
        events_per_s = None
        if catch_up.seconds is not None:
            events_per_s = job.expected_events / catch_up.seconds
            details["catch_up_s"] = round(catch_up.seconds, 3)
            if catch_up.tail_lag_s is not None:
                details["catch_up_tail_lag_s"] = round(catch_up.tail_lag_s, 3)
        else:
            note += f"; catch-up output differs from DuckDB's: {catch_up.difference}"
        p50 = p99 = None
        if job.steady is not None:
            steady = job.steady
            phase, samples = self._phase(job, query, steady.topics, "steady", produce=steady.produce)
            details.update(steady_ready_s=round(phase.ready_s, 2), latency_samples=len(samples),
                           steady_rate=steady.rate)
            if phase.difference:
                note += f"; steady output differs from DuckDB's: {phase.difference}"
            if samples:
                p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
        return PeerResult(self.name, job.query, events_per_s, p50, p99, self.guarantee, catch_up.final_rows,
                          note=note, details=details)
