"""Chaos soak: the demo pipeline under random SIGKILLs, a Redis wipe, a view created and a view replaced
while it runs, and its own Redis server and Kafka broker SIGKILLed and restarted; then the oracle at every
committed epoch of every table and view.

The pipeline is the demo's (``t1 -> mv1 -> mv2, mv3``, ``t2``, and the join ``mvj`` of mv1 and t2) on a
local stack (Apache Kafka + redis-server on free loopback ports, durable in a temporary folder: the
broker's log folder and Redis's append-only file), each part in its own process group so it can be
killed alone:

* ``writer``: a workload of inserts, updates and deletes across the whole key range of t1 and t2;
* ``cache-worker``: ``mvlog cache-worker``, the Faust log cache the consumers read recent epochs from
  (Kafka when it is dead or does not hold them);
* ``lag-sampler``: ``mvlog lag-sampler``, the one control-plane process mvlog has besides the writers
  and consumers (there is no separate coordinator process: DDL runs in the caller, epochs are the
  writers', progress commits with each epoch);
* ``consumer-a``: ``mvlog run-view mv1`` (a Spark session in local mode), which also hydrates and cuts
  over mv1's replacement;
* ``consumer-b``: ``mvlog run-view mv2 mv3 mvj``;
* ``consumer-c``: ``mvlog run-view mv4``, from the moment mv4 is created.

Every ``--kill-every`` seconds (a random interval around it) one of them, picked at random, is killed
with SIGKILL (the whole process group: the JVM dies with its driver) and restarted after a short random
pause. A part that dies by itself is restarted too (and noted). Meanwhile, once each, at a fixed share of
the chaos time, each event waiting for the one before to be over:

* at 20 %: ``mv4`` (the demo's online view, its filter adapted to the workload's values) is created on
  the live mv1 with a chunked backfill, and ``consumer-c`` starts;
* at 30 %: the stack's redis-server is killed with SIGKILL and restarted after ``REDIS_DOWN_S``; it
  comes back from its append-only file, and the processes wait for it and go on (their Redis clients
  retry for up to ``redis_outage_timeout_s``, ``mvlog.connectors.redis.redis_client``): none should need a
  restart, and any that does is counted against the kill;
* at 45 %, once mv4's backfill has committed some rows: Redis is wiped (FLUSHALL); the running
  processes notice and rebuild it from Kafka, nobody is told;
* at 60 %: a replacement of mv1 (a narrower filter) is staged and its apply requested; mv1's consumer
  hydrates it read-only and cuts over at an epoch, under mv2, mv3, mvj and mv4;
* at 80 %, once the replacement is applied: the Kafka broker is killed with SIGKILL mid-epoch (just as
  t1 commits one, while the views' transactions for it are open) and restarted on the same log folder
  after ``BROKER_DOWN_S``.

Each of the two stack kills is followed until its recovery: every table and view past its MCE at the
kill. The seconds until then are printed, and how many parts died of the fault and had to be restarted
(those dying until ``FAULT_GRACE_S`` after the recovery). The random kills pause meanwhile, for
``KILL_PAUSE_MAX_S`` at most.

At the end the writer stops cleanly, the views catch up with its last epoch, and every view is compared
with DuckDB's evaluation of its definition over its upstreams' rows at every committed epoch (the
oracle of ``tests/oracle.py``: mv1 under its old definition before the cut-over and the new one from
it, mv4 on the upstream keys its backfill covered until it finished). Events print as they happen
(``soak: view mv4 created ...``, ``soak: redis killed ...``, ``soak: redis wiped ...``, ``soak: view mv1
replaced ...``, ``soak: broker killed ...``, ``soak: recovered from the ... kill ...``); the last line
reads::

    soak: 3.0 minutes, 9 kills survived, 1234 epochs checked, rows lost 0, rows doubled 0

and the exit code is non-zero when a row was lost or doubled, an event did not happen, or a check failed.

    .venv/bin/python bench/soak.py --minutes 2 --kill-every 12  # the CI's short run (tests/integration/test_soak.py)
    .venv/bin/python bench/soak.py --minutes 20 --seed 7        # the README's reliability run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, machine_info

sys.path.insert(0, str(REPO_ROOT))
from mvlog.config import Settings
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.cache_registry import CacheRegistry
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.replacement_store import ReplacementStore
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.infra.child_processes import die_with_parent
from mvlog.infra.local_stack import LocalStack, free_ports
from mvlog.replacement import Status
from mvlog.services.commands.demo import TABLES, VIEWS  # the demo's pipeline, under chaos
from mvlog.services.replacement.operations import complete_apply, request_apply, stage_replacement
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import alter_view, create_view
from tests.oracle import OracleReport, oracle_report

CONSUMERS: dict[str, list[str]] = {"consumer-a": ["mv1"], "consumer-b": ["mv2", "mv3", "mvj"]}
#: The demo's online view (MV-on-MV over mv1), its filter adapted to the writer's v1 in [-100, 100).
ONLINE_VIEW = ("mv4", "SELECT id, v1 * 2 AS v2 FROM mv1 WHERE v1 >= 50")
ONLINE_CONSUMER = "consumer-c"
#: mv1's replacement: a compatible definition (same columns and key), a narrower filter.
REPLACEMENT = ("mv1", "SELECT * FROM t1 WHERE deleted = false AND v1 > -90")
#: When the events happen, as shares of the chaos time.
CREATE_AT, REDIS_KILL_AT, WIPE_AT, REPLACE_AT, BROKER_KILL_AT = 0.2, 0.3, 0.45, 0.6, 0.8
#: How long the stack's killed redis-server and Kafka broker stay down before they are started again.
REDIS_DOWN_S, BROKER_DOWN_S = 2.0, 2.0
#: Parts that die by themselves until this long after a stack kill's recovery count as dying of it.
FAULT_GRACE_S = 10.0
#: The random kills pause from a stack kill until its recovery, for this long at most (a loaded machine
#: recovers slowly, and the chaos must go on).
KILL_PAUSE_MAX_S = 30.0
#: A stack kill waits at most this long for t1 to commit an epoch, so it lands as the views begin it.
MID_EPOCH_WAIT_S = 5.0
#: The online view's backfill is rate-limited to last about this share of the chaos time, so the wipe
#: meets it half-way (the limit is lifted at the end).
BACKFILL_SHARE = 0.4
KEYS = 500
NAMES = ("ada", "bob", "cy", "dee", "eve")
#: How long the end waits, by default, for the events still to come or under way (a replacement's cut-over)
#: while none of them moves on (each that happens or completes gives the rest that long again: a loaded
#: machine is slow), and then for the views to catch up. ``--patience`` sets it.
PATIENCE_S = 300.0
#: While the end waits, what it waits for is printed this often: a stuck run says where it is stuck.
WAITING_REPORT_S = 30.0
READY = "ready"


#: How often the chaos loop samples the readers' cache and Kafka read counters.
READS_SAMPLE_S = 2.0


def clock(monotonic: float | None = None) -> str:
    """The wall-clock time now, or at an earlier ``time.monotonic()``."""
    at = time.time() if monotonic is None else time.time() - (time.monotonic() - monotonic)
    return time.strftime("%H:%M:%S", time.localtime(at))


# ------------------------------------------------------------------------------------ the writer role


def run_writer(settings: Settings, rate: float, seed: int) -> None:
    """Write random changes into t1 and t2 until SIGTERM, then commit what is pending and exit."""
    rng = random.Random(seed)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    client = redis_client.connect(settings)  # waits through a Redis restart, as every mvlog process does
    t1, t2 = Table.open(settings, "t1", client), Table.open(settings, "t2", client)
    print(READY, flush=True)  # from here on a SIGTERM ends the run with a clean flush
    batch = max(1, int(rate / 20))
    while not stopping:
        t1.upsert({"id": rng.randrange(KEYS), "v1": rng.randrange(-100, 100), "deleted": rng.random() < 0.2}
                  for _ in range(batch))
        t1.delete([rng.randrange(KEYS) for _ in range(max(1, batch // 10))])
        t2.upsert([{"id": rng.randrange(KEYS), "name": rng.choice(NAMES)}])
        if rng.random() < 0.1:
            t2.delete([rng.randrange(KEYS)])
        time.sleep(0.05)
    final = {"t1": t1.flush(), "t2": t2.flush()}
    t1.close()
    t2.close()
    print(json.dumps(final), flush=True)


# ----------------------------------------------------------------------------------- the supervisor


@dataclass
class Process:
    """One killable part of the pipeline, in its own process group."""

    name: str
    argv: list[str]
    log: Path
    child: subprocess.Popen[str] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT)}
        with self.log.open("a") as log:
            log.write(f"--- start {self.starts} at {clock()}\n")
            log.flush()
            self.child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                          cwd=REPO_ROOT, env=env, start_new_session=True,
                                          preexec_fn=die_with_parent())  # no orphans if the soak is killed

    def kill(self) -> None:
        assert self.child is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signal.SIGKILL)
        self.child.wait()

    def wait_for_line(self, expected: str, timeout: float = 120.0) -> None:
        """Read standard output until the process prints ``expected``, dies, or the time is up.

        A process killed and restarted just before the end may not have installed its SIGTERM handler
        yet; the supervisor waits for it to say so instead of guessing how long that takes.
        """
        assert self.child is not None and self.child.stdout is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.child.stdout], [], [], left)
            if not readable:
                break
            line = self.child.stdout.readline()
            if line.strip() == expected:
                return
            if not line:
                raise SystemExit(f"{self.name} exited before printing {expected!r}; see {self.log}")
        raise SystemExit(f"{self.name} did not print {expected!r} within {timeout:.0f} s; see {self.log}")

    def terminate(self, timeout: float = 60.0) -> str:
        """SIGTERM, wait; what it printed on standard output."""
        assert self.child is not None
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGTERM)
        try:
            out, _ = self.child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return ""
        return out or ""

    def alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def errors(self, lines: int = 12) -> str:
        """The last error lines of its log (not librdkafka's, not the JVM's stack frames)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return f"  {self.name}: no log"
        found = [line.rstrip() for line in text.splitlines()
                 if ("Error" in line or "failed" in line or line.startswith("--- start"))
                 and not line.startswith(("%", "\tat ", "  File "))]
        return "\n".join([f"  {self.name}'s log, its last starts and errors:",
                          *(f"    {line[:300]}" for line in found[-lines:])])


def mvlog_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mvlog.services.cli", *args]


@dataclass
class StackKill:
    """A SIGKILL of the stack's own redis-server or Kafka broker, and what it took to get past it."""

    service: str  # "redis" or "kafka", as LocalStack names them
    label: str  # what the event lines call it
    killed_at: float  # time.monotonic() of the SIGKILL
    mces: dict[str, int]  # every table and view's MCE at the kill
    back_after_s: float | None = None  # from the kill until the restarted process answered
    passed_after_s: dict[str, float] = field(default_factory=dict)  # when each got past its MCE at the kill
    recovered_after_s: float | None = None  # from the kill until every table and view was past ``mces``
    restarted: list[str] = field(default_factory=list)  # parts that died of it and were restarted
    reported: bool = False  # its recovery line printed (``FAULT_GRACE_S`` after the recovery)

    def pausing_kills(self, now: float) -> bool:
        """The random kills wait until the tables and views are past the fault (for a clean measure), or
        for ``KILL_PAUSE_MAX_S``."""
        return self.recovered_after_s is None and now < self.killed_at + KILL_PAUSE_MAX_S

    def open(self, now: float) -> bool:
        """Whether a part dying now is taken to die of this fault."""
        return self.recovered_after_s is None or now <= self.killed_at + self.recovered_after_s + FAULT_GRACE_S


@dataclass
class Events:
    """The once-only events of the run and what they led to."""

    created_epoch: int | None = None  # mv1's MCE when mv4 was created
    backfill_rate: int | None = None
    limit_lifted: bool = False
    wipe_started: float | None = None
    wipe_mces: dict[str, int] = field(default_factory=dict)  # every table and view's MCE before the wipe
    rebuilt_after_s: float | None = None
    replacement_id: str | None = None
    applied_epoch: int | None = None
    redis_kill: StackKill | None = None
    broker_kill: StackKill | None = None
    failures: list[str] = field(default_factory=list)

    def stack_kills(self) -> list[StackKill]:
        return [kill for kill in (self.redis_kill, self.broker_kill) if kill is not None]


@dataclass
class SteadyReads:
    """Partition-epochs of one upstream read from the log cache and from Kafka *outside* the ``quiet_s``
    seconds after each fault (a SIGKILL, a Redis kill or wipe, a broker kill): what the cache does while
    nothing is recovering (issue 22 asks at least 90 % from the cache for t1). Pure: the soak feeds it the
    readers' counters (:meth:`CacheRegistry.reads`) every few seconds and the times of the faults."""

    quiet_s: float = 30.0
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (time, from cache, from Kafka)
    faults: list[float] = field(default_factory=list)

    def sample(self, now: float, cached: int, kafka: int) -> None:
        self.samples.append((now, cached, kafka))

    def fault(self, now: float) -> None:
        self.faults.append(now)

    def totals(self) -> tuple[int, int]:
        """(from the cache, from Kafka) over the sample intervals that no fault's quiet window touches."""
        cached_sum = kafka_sum = 0
        for (start, c0, k0), (end, c1, k1) in zip(self.samples, self.samples[1:], strict=False):
            if any(start - self.quiet_s <= fault <= end for fault in self.faults):
                continue
            if c1 < c0 or k1 < k0:  # the counters went with a wipe: they count from 0 again
                c0 = k0 = 0
            cached_sum += c1 - c0
            kafka_sum += k1 - k0
        return cached_sum, kafka_sum


@dataclass
class Soak:
    settings: Settings
    stack: LocalStack
    seed: int
    rate: float
    workdir: Path
    patience: float = PATIENCE_S
    processes: dict[str, Process] = field(default_factory=dict)
    kills: int = 0
    notes: list[str] = field(default_factory=list)
    events: Events = field(default_factory=Events)
    scheduled: list[tuple[float, Callable[[], bool], Callable[[], None]]] = field(default_factory=list)
    steady_reads: SteadyReads = field(default_factory=SteadyReads)
    _next_sample: float = 0.0
    client: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self.client = redis.Redis.from_url(self.settings.redis_url)

    @property
    def store(self) -> ViewStore:
        return ViewStore(self.client, self.settings.topic_prefix)

    def names(self) -> list[str]:
        """Every table and view, upstreams first."""
        return [*TABLES, *VIEWS, *([ONLINE_VIEW[0]] if self.events.created_epoch is not None else [])]

    def setup(self) -> None:
        for name, (columns, key) in TABLES.items():
            Table.create(self.settings, name, columns, key, client=self.client, auto_commit=False).close()
        for name, sql in VIEWS.items():
            create_view(self.settings, name, sql, client=self.client)
        config = self.settings.model_dump_json()
        self.processes["writer"] = Process(
            "writer", [sys.executable, __file__, "--role", "writer", "--settings", config,
                       "--rate", str(self.rate), "--seed", str(self.seed)], self.workdir / "writer.log")
        (cache_port,) = free_ports(1)
        self.processes["cache-worker"] = Process(
            "cache-worker", mvlog_argv("cache-worker", "--port", str(cache_port)), self.workdir / "cache-worker.log")
        self.processes["lag-sampler"] = Process("lag-sampler", mvlog_argv("lag-sampler"),
                                                self.workdir / "lag-sampler.log")
        for name, views in CONSUMERS.items():
            self.processes[name] = Process(name, mvlog_argv("run-view", *views, "--progress-interval", "0"),
                                           self.workdir / f"{name}.log")
        os.environ.update(self.settings.to_env())
        for process in self.processes.values():
            process.start()

    # --- chaos ------------------------------------------------------------------------------------

    def chaos(self, seconds: float, kill_every: float) -> None:
        """Kill a random part every ~``kill_every`` s; run each event once at its share of the time."""
        rng = random.Random(self.seed)
        started = time.monotonic()
        deadline = started + seconds
        # (due, ready, event), in order: each waits for its time, for the one before, and for its condition.
        self.scheduled = [
            (started + CREATE_AT * seconds, self.mv1_has_rows, lambda: self.create_online_view(seconds)),
            (started + REDIS_KILL_AT * seconds, lambda: True, self.kill_redis),
            (started + WIPE_AT * seconds, lambda: self.stack_kill_over("redis") and self.mv4_backfilled_some(),
             self.wipe_redis),
            (started + REPLACE_AT * seconds, lambda: self.events.rebuilt_after_s is not None, self.replace_view),
            (started + BROKER_KILL_AT * seconds, lambda: self.events.applied_epoch is not None, self.kill_broker),
        ]
        next_kill = started + rng.uniform(0.5 * kill_every, 1.5 * kill_every)
        while (now := time.monotonic()) < deadline:
            self.sample_reads(now)
            self.restart_dead()
            self.run_due_event(now)
            self.follow_events()
            if any(kill.pausing_kills(now) for kill in self.events.stack_kills()):
                next_kill = max(next_kill, now + 0.5 * kill_every)  # after the pause, not at once
            elif now >= next_kill:
                victim = self.processes[rng.choice(sorted(self.processes))]
                victim.kill()
                self.steady_reads.fault(time.monotonic())
                self.kills += 1
                time.sleep(rng.uniform(0, 2.0))  # the victim stays down for a random while
                victim.start()
                print(f"  {clock()} SIGKILL {victim.name} (kill {self.kills})", flush=True)
                next_kill = time.monotonic() + rng.uniform(0.5 * kill_every, 1.5 * kill_every)
            time.sleep(0.2)

    def sample_reads(self, now: float) -> None:
        """Every :data:`READS_SAMPLE_S`: the consumers' cache and Kafka reads of t1 (:class:`SteadyReads`)."""
        if now >= self._next_sample:
            with contextlib.suppress(redis.RedisError):  # Redis may be down (its own kill)
                self.steady_reads.sample(now, *CacheRegistry(self.client, self.settings.topic_prefix).reads("t1"))
            self._next_sample = now + READS_SAMPLE_S

    def run_due_event(self, now: float) -> None:
        if self.scheduled and self.scheduled[0][0] <= now and self.scheduled[0][1]():
            _, _, event = self.scheduled.pop(0)
            event()

    def restart_dead(self, when: str = "", *, writer: bool = True) -> None:
        """Restart a part that died by itself (a finding, noted; not a kill), the writer only if asked."""
        for process in self.processes.values():
            if (writer or process.name != "writer") and not process.alive():
                code = process.child.returncode if process.child else None
                now = time.monotonic()
                causes = [kill for kill in self.events.stack_kills() if kill.open(now)]
                cause = f", counted as a restart after the {causes[-1].label} kill" if causes else ""
                self.notes.append(f"{process.name} exited by itself{when} (exit code {code}) at {clock()}{cause}")
                if causes:
                    causes[-1].restarted.append(process.name)
                process.start()

    # --- the events -------------------------------------------------------------------------------

    def stack_kill_over(self, service: str) -> bool:
        """The stack kill of ``service`` happened, every table and view got past it, and the parts that died
        of it were counted (its recovery line printed)."""
        kill = self.events.redis_kill if service == "redis" else self.events.broker_kill
        return kill is not None and kill.reported

    def mces(self) -> dict[str, int]:
        return {n: m or 0 for n, m in self.store.mce_many(self.names()).items()}

    def kill_stack(self, service: str, label: str, down_s: float) -> StackKill:
        """SIGKILL one process of the stack just as t1 commits an epoch (the views then have it in hand),
        restart it after ``down_s`` on its data; the views' MCEs at the kill are what it must get past."""
        before = self.store.mce("t1")
        deadline = time.monotonic() + MID_EPOCH_WAIT_S
        while self.store.mce("t1") == before and time.monotonic() < deadline:
            time.sleep(0.01)
        mces = self.mces()
        self.steady_reads.fault(time.monotonic())
        self.stack.kill(service)
        kill = StackKill(service, label, time.monotonic(), mces)
        time.sleep(down_s)
        report = self.stack.start()
        kill.back_after_s = time.monotonic() - kill.killed_at
        if report.started != (service,):
            self._fail(f"restarting {label} started {report.started}, kept {report.kept}")
        return kill

    def kill_redis(self) -> None:
        """SIGKILL redis-server; it restarts from its append-only file, nobody is told."""
        kill = self.kill_stack("redis", "redis", REDIS_DOWN_S)
        self.events.redis_kill = kill
        print(f"soak: redis killed (SIGKILL) at {clock(kill.killed_at)}, t1 at epoch {kill.mces['t1']}, "
              f"restarted after {kill.back_after_s:.1f} s (from its append-only file)", flush=True)

    def kill_broker(self) -> None:
        """SIGKILL the Kafka broker mid-epoch; it restarts on the same log folder, nobody is told."""
        kill = self.kill_stack("kafka", "broker", BROKER_DOWN_S)
        self.events.broker_kill = kill
        print(f"soak: broker killed (SIGKILL) at {clock(kill.killed_at)} mid-epoch, t1 just past epoch "
              f"{kill.mces['t1']}, restarted on its log folder after {kill.back_after_s:.1f} s", flush=True)

    def mv1_has_rows(self) -> bool:
        """mv1 is live (its consumer started, on this loaded machine, and committed some rows)."""
        return self.store.row_count("mv1") > 0

    def mv4_backfilled_some(self) -> bool:
        """mv4's backfill has committed rows (or finished): the wipe then meets positions to restore."""
        state = self.store.backfill_state(ONLINE_VIEW[0])
        return b"done" in state or int(state.get(b"rows_done", 0)) > 0

    def create_online_view(self, seconds: float) -> None:
        """mv4 on the live mv1, backfilled in chunks at a rate that spreads it over ``BACKFILL_SHARE``."""
        name, sql = ONLINE_VIEW
        upstream_mce = self.store.mce("mv1") or 0
        rows = self.store.row_count("mv1")
        create_view(self.settings, name, sql, client=self.client, backfill="chunked")
        rate = max(1, math.ceil(rows / (BACKFILL_SHARE * seconds)))
        alter_view(self.settings, name, client=self.client, backfill_rate_limit=rate)
        self.events.created_epoch, self.events.backfill_rate = upstream_mce, rate
        self.processes[ONLINE_CONSUMER] = Process(
            ONLINE_CONSUMER, mvlog_argv("run-view", name, "--progress-interval", "0"),
            self.workdir / f"{ONLINE_CONSUMER}.log")
        self.processes[ONLINE_CONSUMER].start()
        print(f"soak: view {name} created at {clock()} on mv1 at epoch {upstream_mce} ({rows} rows), online with a "
              f"chunked backfill limited to {rate} rows/s: {sql}", flush=True)

    def wipe_redis(self) -> None:
        """FLUSHALL, telling nobody: the processes must notice and rebuild from Kafka by themselves."""
        self.events.wipe_mces = {n: m or 0 for n, m in self.store.mce_many(self.names()).items()}
        backfill = self.store.backfill_state(ONLINE_VIEW[0])
        self.client.flushall()
        self.events.wipe_started = time.monotonic()
        self.steady_reads.fault(self.events.wipe_started)
        state = ("not created yet" if self.events.created_epoch is None else "backfill done" if b"done" in backfill
                 else f"backfilling ({int(backfill.get(b'rows_done', 0))} rows done)")
        print(f"soak: redis wiped (FLUSHALL) at {clock()}, t1 at epoch {self.events.wipe_mces['t1']}, "
              f"{ONLINE_VIEW[0]} {state}", flush=True)

    def replace_view(self) -> None:
        """Stage mv1's replacement and ask for its cut-over at once: mv1's consumer hydrates it first."""
        view, sql = REPLACEMENT
        record = stage_replacement(self.settings, view, sql, client=self.client)
        request_apply(self.settings, view, client=self.client)
        self.events.replacement_id = record.id
        print(f"soak: replacement {record.id} of {view} staged at {clock()}, apply requested: {sql}", flush=True)

    def follow_events(self) -> None:
        """Note when the rebuild after the wipe is complete, when the replacement is applied, and when every
        table and view is past a stack kill."""
        events = self.events
        now = time.monotonic()
        self.note_failed_views()
        for kill in events.stack_kills():
            if kill.recovered_after_s is None:
                mces = self.store.mce_many(list(kill.mces))
                for name, before in kill.mces.items():
                    if name not in kill.passed_after_s and (mces[name] or 0) > before:
                        kill.passed_after_s[name] = now - kill.killed_at
                if all(name in kill.passed_after_s for name in kill.mces):  # those with no epoch yet too
                    kill.recovered_after_s = now - kill.killed_at
            elif not kill.reported and not kill.open(now):
                kill.reported = True
                last = max(kill.passed_after_s, key=kill.passed_after_s.__getitem__, default="none")
                parts = f" ({', '.join(kill.restarted)})" if kill.restarted else ""
                print(f"soak: recovered from the {kill.label} kill {kill.recovered_after_s:.1f} s after it: every "
                      f"table and view past its epoch at the kill (the last: {last}); {len(kill.restarted)} "
                      f"process(es) had to be restarted{parts}", flush=True)
        if events.wipe_started is not None and events.rebuilt_after_s is None:
            mces = self.store.mce_many(list(events.wipe_mces))
            if not CatalogStore(self.settings, self.client).wiped() and all(
                    (mces[n] or 0) > before for n, before in events.wipe_mces.items() if before):
                events.rebuilt_after_s = time.monotonic() - events.wipe_started
                print(f"soak: redis rebuilt from Kafka {events.rebuilt_after_s:.1f} s after the wipe: control plane "
                      f"back, every table and view past its epoch before the wipe", flush=True)
        if events.replacement_id is not None and events.applied_epoch is None:
            view = REPLACEMENT[0]
            replacements = ReplacementStore(self.client, self.settings.topic_prefix)
            record = replacements.record(view)
            if record is None or record.id != events.replacement_id or record.status is Status.DISCARDED:
                self._fail(f"the replacement {events.replacement_id} of {view} is gone: {record}")
            elif record.fields and record.fields.get("error"):
                self._fail(f"the replacement {events.replacement_id} of {view} failed: {record.fields['error']}")
            elif record.status is Status.APPLIED and record.applied_epoch is not None:
                complete_apply(CatalogStore(self.settings, self.client), replacements, view)
                events.applied_epoch = record.applied_epoch
                print(f"soak: view {view} replaced at {clock()}: replacement {record.id} applied at epoch "
                      f"{record.applied_epoch} (version {record.applied_version})", flush=True)

    def note_failed_views(self) -> None:
        """A view its consumer marked failed stops there (its process goes on with the others, so nothing
        restarts it): the run fails at once with the reason instead of waiting for it to catch up."""
        for name in self.names():
            if name not in TABLES and self.store.lifecycle(name) is Lifecycle.FAILED:
                self._fail(f"{name} failed: {self.store.meta(name).get('reason', '')}")

    def _fail(self, reason: str) -> None:
        if reason not in self.events.failures:
            self.events.failures.append(reason)
            print(f"  {clock()} FAILED: {reason}", flush=True)

    def events_under_way(self) -> bool:
        return not self.events.failures and bool(self.waiting_for())

    def waiting_for(self) -> list[str]:
        """The events still to come or under way, and where each stands (what a stuck run prints)."""
        events = self.events
        waiting = [f"{len(self.scheduled)} event(s) to come"] if self.scheduled else []
        if events.wipe_started is not None and events.rebuilt_after_s is None:
            stuck = sorted(n for n, m in self.mces().items() if m <= events.wipe_mces.get(n, 0))
            waiting.append(f"the rebuild after the wipe (not yet past their epoch at the wipe: {stuck})")
        if events.replacement_id is not None and events.applied_epoch is None:
            waiting.append(f"the replacement {events.replacement_id} of {REPLACEMENT[0]} to be applied")
        if events.created_epoch is not None and self.store.backfill_state(ONLINE_VIEW[0]).get(b"done") is None:
            waiting.append(f"{ONLINE_VIEW[0]}'s backfill")
        for kill in events.stack_kills():
            if not kill.reported:
                stuck = sorted(set(kill.mces) - set(kill.passed_after_s))
                waiting.append(f"the recovery from the {kill.label} kill (not yet past their epoch at it: {stuck})")
        return waiting

    def events_progress(self) -> tuple[object, ...]:
        """What changes as the events happen and complete."""
        events = self.events
        return (len(self.scheduled), events.rebuilt_after_s is not None, events.applied_epoch is not None,
                events.limit_lifted, b"done" in self.store.backfill_state(ONLINE_VIEW[0]),
                *((kill.recovered_after_s is not None, kill.reported) for kill in events.stack_kills()))

    # --- the end ----------------------------------------------------------------------------------

    def finish(self) -> dict[str, int]:
        """Let the events still to come or under way finish (without kills; the backfill's rate limit
        lifted), stop the writer cleanly and wait for every view to reach its upstreams' last epochs."""
        if self.scheduled:
            self.notes.append(f"{len(self.scheduled)} event(s) came after the chaos (a slow start)")
        deadline = time.monotonic() + self.patience
        next_report = time.monotonic() + WAITING_REPORT_S
        progress = self.events_progress()
        while self.events_under_way():
            if (now := self.events_progress()) != progress:
                progress, deadline = now, time.monotonic() + self.patience
            if time.monotonic() > deadline:
                self._fail(f"events still under way after the chaos, none moving on for {self.patience:.0f} s: "
                           f"{'; '.join(self.waiting_for())}")
                break
            if time.monotonic() > next_report:
                print(f"  {clock()} waiting for {'; '.join(self.waiting_for())}", flush=True)
                next_report = time.monotonic() + WAITING_REPORT_S
            self.restart_dead(" after the chaos")
            self.sample_reads(time.monotonic())
            self.run_due_event(time.monotonic())
            # Lifted only once a chunk committed under the limit: when kills kept the online view's consumer
            # restarting through the whole chaos, lifting it at once let the backfill finish in one epoch,
            # leaving the oracle no partly covered epoch to check.
            if (self.events.created_epoch is not None and not self.events.limit_lifted
                    and self.mv4_backfilled_some()):
                alter_view(self.settings, ONLINE_VIEW[0], client=self.client, backfill_rate_limit=None)
                self.events.limit_lifted = True
            self.follow_events()
            time.sleep(0.2)
        writer = self.processes["writer"]
        writer.wait_for_line(READY)
        out = writer.terminate()
        if not out.strip():
            raise SystemExit(f"the writer did not stop cleanly; see {writer.log}")
        final: dict[str, int] = json.loads(out.strip().splitlines()[-1])
        deadline = time.monotonic() + self.patience
        next_report = time.monotonic() + WAITING_REPORT_S
        # A view has one epoch per upstream epoch; a join's last one is its least advanced upstream's.
        expected = {name: final["t1"] for name in self.names() if name not in TABLES}
        expected["mvj"] = min(final.values())
        while True:
            behind = {v: (self.store.mce(v) or 0, e) for v, e in expected.items() if (self.store.mce(v) or 0) < e}
            if not behind:
                break
            self.note_failed_views()
            if self.events.failures:
                raise SystemExit(f"views that cannot catch up: {'; '.join(self.events.failures)}")
            if time.monotonic() > deadline:
                raise SystemExit(f"views did not catch up within {self.patience:.0f} s: {behind}")
            if time.monotonic() > next_report:
                print(f"  {clock()} waiting for the views to catch up (MCE, target): {behind}", flush=True)
                next_report = time.monotonic() + WAITING_REPORT_S
            self.restart_dead(" while catching up", writer=False)
            time.sleep(0.5)
        for name in self.processes:
            if name != "writer":
                self.processes[name].terminate()
        return final

    def check_events(self, report: OracleReport) -> list[str]:
        """What the oracle must have seen of the events: each happened, and was checked."""
        problems = list(self.events.failures)
        events = self.events
        if events.created_epoch is None:
            problems.append(f"{ONLINE_VIEW[0]} was not created")
        if events.wipe_started is None or events.rebuilt_after_s is None:
            problems.append("Redis was not wiped, or not rebuilt from Kafka")
        for kill, label in ((events.redis_kill, "redis-server"), (events.broker_kill, "the Kafka broker")):
            if kill is None or kill.back_after_s is None:
                problems.append(f"{label} was not killed and restarted")
            elif kill.recovered_after_s is None:
                problems.append(f"the tables and views did not all get past their epochs at the kill of {label}")
        if events.applied_epoch is None:
            problems.append(f"the replacement of {REPLACEMENT[0]} was not applied")
        elif [sql for _, sql in report.definitions.get(REPLACEMENT[0], [])][-1:] != [REPLACEMENT[1]]:
            problems.append(f"the oracle did not check {REPLACEMENT[0]} under its new definition")
        return problems


def cache_reads(settings: Settings, client: redis.Redis) -> str:
    """Partition-epochs the consumers read from the log cache and from Kafka (counted since the wipe)."""
    registry = CacheRegistry(client, settings.topic_prefix)
    parts = []
    for upstream in ("t1", "t2", "mv1"):
        cached, kafka = registry.reads(upstream)
        parts.append(f"{upstream} {cached}/{cached + kafka}")
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes of chaos (default 3)")
    parser.add_argument("--kill-every", type=float, default=15.0,
                        help="mean seconds between two kills (default 15)")
    parser.add_argument("--rate", type=float, default=200.0, help="changes/s the writer aims at (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--patience", type=float, default=PATIENCE_S,
                        help="seconds the end waits for a stuck event or catch-up before it gives up "
                             f"(default {PATIENCE_S:g})")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after the run")
    parser.add_argument("--role", choices=("supervisor", "writer"), default="supervisor", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)

    if args.role == "writer":
        run_writer(Settings.model_validate_json(args.settings), args.rate, seed)
        return 0

    # SIGTERM (a test's time limit) ends the run through the ``finally`` below: children and stack stopped.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="mvlog-soak-"))
    kafka_port, redis_port = free_ports(2)
    stack = LocalStack(data_dir=workdir / "stack", kafka_port=kafka_port, redis_port=redis_port,
                       die_with_parent=True)
    stack.start()
    print(f"soak: seed {seed}, {args.minutes:g} minute(s) of chaos, a kill every ~{args.kill_every:g} s, "
          f"logs in {workdir}", flush=True)
    print(machine_info(), flush=True)
    soak = Soak(stack.settings(topic_prefix="soak", barrier_interval_ms=500, partitions=3), stack, seed,
                args.rate, workdir, patience=args.patience)
    failed = True
    try:
        soak.setup()
        soak.chaos(args.minutes * 60, args.kill_every)
        chaos_done = time.monotonic()
        final = soak.finish()
        finished = time.monotonic()
        reads = cache_reads(soak.settings, soak.client)
        report = oracle_report(soak.settings, soak.client, soak.names())
        checked = time.monotonic()
        event_problems = soak.check_events(report)
        failed = not report.ok or bool(event_problems)
    except BaseException:
        failed = True
        raise
    finally:
        for process in soak.processes.values():
            if process.alive():
                process.kill()
        soak.client.close()
        stack.stop()
        if failed:  # the logs stay in the work folder, but a CI keeps only what was printed
            for process in soak.processes.values():
                print(process.errors(), flush=True)
    for note in soak.notes:
        print(f"  note: {note}")
    for problem in [*event_problems, *report.problems][:20]:
        print(f"  PROBLEM: {problem}")
    for view, defined in report.definitions.items():
        print(f"  oracle: {view} checked under {len(defined)} definitions: "
              + "; ".join(f"from epoch {start or 'its first'}: {sql}" for start, sql in defined))
    for view, (first, last) in report.backfilled.items():
        print(f"  oracle: {view} checked on the upstream keys its backfill covered at epochs {first}..{last}, "
              "in full after")
    print(f"  read from the log cache (partition-epochs, of all read since the wipe): {reads}")
    cached, kafka = soak.steady_reads.totals()
    share = f"{cached / (cached + kafka):.0%}" if cached + kafka else "-"
    print(f"  read from the log cache outside the {soak.steady_reads.quiet_s:.0f} s after each of "
          f"{len(soak.steady_reads.faults)} faults: t1 {cached}/{cached + kafka} ({share}; target 90 %)")
    print(f"  last epochs: t1 {final['t1']}, t2 {final['t2']}; restarts: "
          f"{', '.join(f'{p.name} {p.starts - 1}' for p in soak.processes.values())}")
    print(f"  time: chaos {(chaos_done - started) / 60:.1f} min (with the stack's start), end of events and "
          f"catch-up {finished - chaos_done:.0f} s, oracle {checked - finished:.0f} s")
    minutes = (time.monotonic() - started) / 60
    print(f"soak: {minutes:.1f} minutes, {soak.kills} kills survived, {report.epochs_checked} epochs checked, "
          f"rows lost {report.rows_lost}, rows doubled {report.rows_doubled}")
    ok = report.ok and not event_problems
    if ok and not args.keep:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
