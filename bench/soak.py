"""Chaos soak: the demo pipeline under random SIGKILLs, then the oracle at every committed epoch.

The pipeline is the demo's (``t1 -> mv1 -> mv2, mv3``, ``t2``, and the join ``mvj`` of mv1 and t2) on a
local stack (Tansu + redis-server on free loopback ports, in a temporary folder), each part in its own
process group so it can be killed alone:

* ``writer``: a workload of inserts, updates and deletes across the whole key range of t1 and t2;
* ``consumer-a``: ``mvlog run-view mv1`` (a Spark session in local mode);
* ``consumer-b``: ``mvlog run-view mv2 mv3 mvj``.

Every ``--kill-every`` seconds (a random interval around it) one of them, picked at random, is killed
with SIGKILL (the whole process group: the JVM dies with its driver) and restarted after a short random
pause. At the end the writer stops cleanly, the views catch up with its last epoch, and every view is
compared with DuckDB's evaluation of its definition over its upstreams' rows at every committed epoch
(the oracle of ``tests/oracle.py``). The last line reads::

    soak: 3.0 minutes, 9 kills survived, 1234 epochs checked, rows lost 0, rows doubled 0

and the exit code is non-zero when a row was lost or doubled or a check failed.

    .venv/bin/python bench/soak.py --minutes 3            # the CI's short run (tests/test_soak.py)
    .venv/bin/python bench/soak.py --minutes 20 --seed 7  # the README's reliability run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, machine_info

sys.path.insert(0, str(REPO_ROOT))
from mvlog.config import Settings
from mvlog.connectors.view_store import ViewStore
from mvlog.infra.local_stack import LocalStack, free_ports
from mvlog.services.commands.demo import TABLES, VIEWS  # the demo's pipeline, under chaos
from mvlog.services.table_writer import Table
from mvlog.services.view_ddl import create_view
from tests.oracle import oracle_report

CONSUMERS: dict[str, list[str]] = {"consumer-a": ["mv1"], "consumer-b": ["mv2", "mv3", "mvj"]}
KEYS = 500
NAMES = ("ada", "bob", "cy", "dee", "eve")
CATCH_UP_TIMEOUT_S = 300.0
READY = "ready"


# ------------------------------------------------------------------------------------ the writer role


def run_writer(settings: Settings, rate: float, seed: int) -> None:
    """Write random changes into t1 and t2 until SIGTERM, then commit what is pending and exit."""
    rng = random.Random(seed)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    client = redis.Redis.from_url(settings.redis_url)
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
            log.write(f"--- start {self.starts} at {time.strftime('%H:%M:%S')}\n")
            log.flush()
            self.child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                          cwd=REPO_ROOT, env=env, start_new_session=True)

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


@dataclass
class Soak:
    settings: Settings
    seed: int
    rate: float
    workdir: Path
    processes: dict[str, Process] = field(default_factory=dict)
    kills: int = 0
    events: list[str] = field(default_factory=list)

    def setup(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        for name, (columns, key) in TABLES.items():
            Table.create(self.settings, name, columns, key, client=client, auto_commit=False).close()
        for name, sql in VIEWS.items():
            create_view(self.settings, name, sql, client=client)
        client.close()
        config = self.settings.model_dump_json()
        self.processes["writer"] = Process(
            "writer", [sys.executable, __file__, "--role", "writer", "--settings", config,
                       "--rate", str(self.rate), "--seed", str(self.seed)], self.workdir / "writer.log")
        for name, views in CONSUMERS.items():
            self.processes[name] = Process(
                name, [sys.executable, "-m", "mvlog.services.cli", "run-view", *views, "--progress-interval", "0"],
                self.workdir / f"{name}.log")
        os.environ.update(self.settings.to_env())
        for process in self.processes.values():
            process.start()

    def chaos(self, seconds: float, kill_every: float) -> None:
        rng = random.Random(self.seed)
        deadline = time.monotonic() + seconds
        while (now := time.monotonic()) < deadline:
            time.sleep(min(deadline - now, rng.uniform(0.5 * kill_every, 1.5 * kill_every)))
            if time.monotonic() >= deadline:
                break
            for process in self.processes.values():  # a part that died by itself is a finding, not a kill
                if not process.alive():
                    code = process.child.returncode if process.child else None
                    self.events.append(f"{process.name} exited by itself (exit code {code})")
                    process.start()
            victim = self.processes[rng.choice(sorted(self.processes))]
            victim.kill()
            self.kills += 1
            time.sleep(rng.uniform(0, 2.0))
            victim.start()
            print(f"  {time.strftime('%H:%M:%S')} SIGKILL {victim.name} (kill {self.kills})", flush=True)

    def finish(self) -> dict[str, int]:
        """Stop the writer cleanly and wait for every view to reach its upstreams' last epochs."""
        writer = self.processes["writer"]
        writer.wait_for_line(READY)
        out = writer.terminate()
        if not out.strip():
            raise SystemExit(f"the writer did not stop cleanly; see {writer.log}")
        final: dict[str, int] = json.loads(out.strip().splitlines()[-1])
        client = redis.Redis.from_url(self.settings.redis_url)
        store = ViewStore(client, self.settings.topic_prefix)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        # A view has one epoch per upstream epoch; a join's last one is its least advanced upstream's.
        expected = {"mv1": final["t1"], "mv2": final["t1"], "mv3": final["t1"], "mvj": min(final.values())}
        while True:
            behind = {v: (store.mce(v) or 0, e) for v, e in expected.items() if (store.mce(v) or 0) < e}
            if not behind:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"views did not catch up within {CATCH_UP_TIMEOUT_S:.0f} s: {behind}")
            for process in self.processes.values():
                if process.name != "writer" and not process.alive():
                    self.events.append(f"{process.name} exited by itself while catching up")
                    process.start()
            time.sleep(0.5)
        client.close()
        for name in CONSUMERS:
            self.processes[name].terminate()
        return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="minutes of chaos (default 3)")
    parser.add_argument("--kill-every", type=float, default=15.0,
                        help="mean seconds between two kills (default 15)")
    parser.add_argument("--rate", type=float, default=200.0, help="changes/s the writer aims at (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) after the run")
    parser.add_argument("--role", choices=("supervisor", "writer"), default="supervisor", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)

    if args.role == "writer":
        run_writer(Settings.model_validate_json(args.settings), args.rate, seed)
        return 0

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="mvlog-soak-"))
    kafka_port, redis_port = free_ports(2)
    stack = LocalStack(data_dir=workdir / "stack", kafka_port=kafka_port, redis_port=redis_port,
                       die_with_parent=True)
    stack.start()
    print(f"soak: seed {seed}, {args.minutes:g} minute(s) of chaos, a kill every ~{args.kill_every:g} s, "
          f"logs in {workdir}", flush=True)
    print(machine_info(), flush=True)
    soak = Soak(stack.settings(topic_prefix="soak", barrier_interval_ms=500, partitions=3), seed, args.rate,
                workdir)
    try:
        soak.setup()
        soak.chaos(args.minutes * 60, args.kill_every)
        final = soak.finish()
        client = redis.Redis.from_url(soak.settings.redis_url)
        report = oracle_report(soak.settings, client, [*TABLES, *VIEWS])
        client.close()
    finally:
        for process in soak.processes.values():
            if process.alive():
                process.kill()
        stack.stop()
    for event in soak.events:
        print(f"  note: {event}")
    for problem in report.problems[:20]:
        print(f"  PROBLEM: {problem}")
    minutes = (time.monotonic() - started) / 60
    print(f"  last epochs: t1 {final['t1']}, t2 {final['t2']}; restarts: "
          f"{', '.join(f'{p.name} {p.starts - 1}' for p in soak.processes.values())}")
    print(f"soak: {minutes:.1f} minutes, {soak.kills} kills survived, {report.epochs_checked} epochs checked, "
          f"rows lost {report.rows_lost}, rows doubled {report.rows_doubled}")
    if report.ok and not args.keep:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
