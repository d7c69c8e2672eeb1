"""Run every benchmark in bench/ in sequence (``make bench`` calls this).

A benchmark is a ``bench/*.py`` script whose name does not start with ``_`` (helpers) and is not this
file. Each runs in its own process with this interpreter and its default options; its output is shown
as it comes, and the last line of each (by convention its ratio) is repeated in a summary at the end.
The exit code is non-zero when any benchmark failed.

    /tmp/venv/bin/python bench/run.py            # all of them
    /tmp/venv/bin/python bench/run.py codec      # only the named ones
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def benchmarks() -> list[Path]:
    return sorted(p for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_") and p.name != "run.py")


def run_one(script: Path) -> tuple[int, str, float]:
    """Run ``script``, echoing its output; its exit code, last output line and seconds taken."""
    start = time.monotonic()
    last = ""
    with subprocess.Popen([sys.executable, str(script)], cwd=BENCH_DIR.parent, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as child:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            # librdkafka's own log lines (%N|...) are noise, not results
            if line.strip() and not line.startswith("%"):
                last = line.rstrip()
    return child.returncode, last, time.monotonic() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (file names without .py); default: all")
    args = parser.parse_args(argv)
    found = {p.stem: p for p in benchmarks()}
    unknown = [n for n in args.names if n not in found]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(found)}", file=sys.stderr)
        return 2
    selected = [found[n] for n in args.names] if args.names else list(found.values())
    results = []
    for script in selected:
        print(f"=== bench/{script.name}", flush=True)
        results.append((script.name, *run_one(script)))
        print(flush=True)
    print("=== summary")
    for name, code, last, seconds in results:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"  {name:<12} {status:<18} {seconds:6.0f} s  {last}")
    return 0 if all(code == 0 for _, code, _, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
