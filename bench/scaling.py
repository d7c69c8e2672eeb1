"""How a view's catch-up in Spark's tasks scales with cores, against the plain Spark job (issue 19's Show
item): ``bench/views.py`` run once per Spark master, the same seeded workload each time, and its best
catch-up seconds per side read back (``views.py --json``).

For each master it prints each view's catch-up rate in tasks and the plain job's, and their ratio; then,
from the first master to each later one, each side's scaling factor (its rate there over its rate at the
first) and how well mvlog scales against the plain job (mvlog's factor over the plain job's; target at
least 0.8x: mvlog gains at least 80 % of what the plain job gains from the added cores).

    .venv/bin/python bench/scaling.py [--masters 'local[1],local[2]'] [-- extra views.py arguments]

The arguments after ``--`` go to every ``views.py`` run (defaults: ``--tasks --no-driver-path
--live-epochs 0 --repeat 2``: only the task path and the plain job, catch-up only, best of two). Each
run starts its own stack and Spark session, so a run's JVM and Python workers do not warm the next. On a
machine whose cores also run the broker and redis-server, a second core is shared with them: the plain
job barely uses them, mvlog does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_VIEWS_ARGS = ["--tasks", "--no-driver-path", "--live-epochs", "0", "--repeat", "2"]
TARGET = 0.8  # mvlog's scaling factor over the plain job's


def run_views(master: str, views_args: Sequence[str], out: Path) -> dict[str, Any]:
    """One ``views.py`` run at ``master``: its JSON results, written to ``out`` (its own output goes to this
    one's stderr)."""
    command = [sys.executable, str(Path(__file__).with_name("views.py")), "--master", master, "--json", str(out),
               *views_args]
    print(f"running: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def rate(changes: int, seconds: float | None) -> float | None:
    return changes / seconds if seconds else None


def factors(first: dict[str, Any], run: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per view run in tasks at both masters: the plain job's and mvlog's rate at ``run`` over at ``first``
    (the same changes in both runs, so a ratio of seconds)."""
    out = {}
    for view, seconds in run["views"].items():
        base = first["views"].get(view)
        if base is not None and seconds["in_tasks_s"] is not None and base["in_tasks_s"] is not None:
            out[view] = (base["baseline_s"] / seconds["baseline_s"], base["in_tasks_s"] / seconds["in_tasks_s"])
    return out


def report(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The lines printed for ``runs`` (one ``views.py --json`` result per master, the first the base); the
    last, the ratio line: mvlog's scaling factor over the plain job's, per view, from the first master to
    the last."""
    lines = [runs[0]["machine"]]
    first = runs[0]
    for run in runs:
        lines.append(f"  {run['master']}:")
        for view, seconds in run["views"].items():
            plain, mvlog = rate(run["changes"], seconds["baseline_s"]), rate(run["changes"], seconds["in_tasks_s"])
            assert plain is not None
            in_tasks = (f"in tasks {mvlog:>9,.0f} changes/s, {mvlog / plain:.2f}x the plain job"
                        if mvlog is not None else "in tasks: not run")
            lines.append(f"    {view:<9} plain job {plain:>9,.0f} records/s; {in_tasks}")
    for run in runs[1:]:
        lines.append(f"  {run['master']} over {first['master']}:")
        for view, (plain, mvlog) in factors(first, run).items():
            verdict = "met" if mvlog / plain >= TARGET else "not met"
            lines.append(f"    {view:<9} plain job {plain:.2f}x, in tasks {mvlog:.2f}x: mvlog scales "
                         f"{mvlog / plain:.2f}x as well as the plain job (target >= {TARGET}x: {verdict})")
    last = factors(first, runs[-1])
    ratios = ", ".join(f"{view} {mvlog / plain:.2f}x" for view, (plain, mvlog) in last.items()) or "none in tasks"
    lines.append(f"ratio mvlog's scaling / the plain job's, {runs[-1]['master']} over {first['master']}: {ratios} "
                 f"(target >= {TARGET}x)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--masters", default="local[1],local[2]",
                        help="Spark masters, comma-separated, the first the base (default 'local[1],local[2]')")
    args = parser.parse_args(own)
    masters = [m.strip() for m in args.masters.split(",") if m.strip()]
    if len(masters) < 2:
        parser.error("--masters needs at least two masters to compare")
    if any(a == "--master" or a.startswith("--master=") or a == "--json" for a in extra):
        parser.error("--master and --json are this script's to set: use --masters")
    views_args = extra or DEFAULT_VIEWS_ARGS
    if "--tasks" not in views_args:
        parser.error("the views.py arguments must include --tasks: the scaling compared is the task path's")
    with tempfile.TemporaryDirectory(prefix="mvlog-bench-scaling-") as folder:
        runs = [run_views(master, views_args, Path(folder) / f"views-{i}.json") for i, master in enumerate(masters)]
    print(f"scaling benchmark: bench/views.py {' '.join(views_args)}, {runs[0]['changes']:,} changes per catch-up, "
          f"best catch-up per side at each master")
    print("\n".join(report(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
