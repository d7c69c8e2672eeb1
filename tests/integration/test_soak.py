"""The CI's short chaos soak (bench/soak.py): random SIGKILLs of every process, a Redis wipe, a view created
and a view replaced while it runs, the stack's redis-server and Kafka broker SIGKILLed and restarted, then
the oracle at every committed epoch."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.timeout(900)]  # the run itself may take 900 s (below): 5-10 min on this machine

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"soak: ([\d.]+) minutes, (\d+) kills survived, (\d+) epochs checked, "
                     r"rows lost (\d+), rows doubled (\d+)")
#: The events the soak prints when they happen, and what the oracle says it checked of them.
EVENTS = {
    "view created online": re.compile(r"^soak: view mv4 created at .* with a chunked backfill", re.M),
    "redis wiped": re.compile(r"^soak: redis wiped \(FLUSHALL\) at .*, mv4 (backfilling \([1-9]|backfill done)", re.M),
    "rebuilt from kafka": re.compile(r"^soak: redis rebuilt from Kafka [\d.]+ s after the wipe", re.M),
    "view replaced": re.compile(r"^soak: view mv1 replaced at .* applied at epoch \d+", re.M),
    "redis killed": re.compile(r"^soak: redis killed \(SIGKILL\) at .*, restarted after [\d.]+ s", re.M),
    "recovered from the redis kill": re.compile(
        r"^soak: recovered from the redis kill [\d.]+ s after it: every table and view past its epoch", re.M),
    "broker killed": re.compile(r"^soak: broker killed \(SIGKILL\) at .* mid-epoch, .* restarted on its log folder "
                                r"after [\d.]+ s", re.M),
    "recovered from the broker kill": re.compile(
        r"^soak: recovered from the broker kill [\d.]+ s after it: every table and view past its epoch", re.M),
    "oracle under both definitions": re.compile(r"^  oracle: mv1 checked under 2 definitions", re.M),
    "oracle on the covered keys": re.compile(r"^  oracle: mv4 checked on the upstream keys its backfill covered",
                                             re.M),
}
KILLED = re.compile(r"SIGKILL (\S+) \(kill \d+\)")


def test_short_soak_loses_and_doubles_nothing(report: Callable[[str], None]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2", "--kill-every", "12"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    found = SUMMARY.search(done.stdout)
    assert found, f"no summary line (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report("\n".join(line for line in done.stdout.splitlines()  # the soak's line goes to the CI log
                      if line.startswith(("soak: ", "  oracle: ", "  read from"))))
    _minutes, kills, epochs, lost, doubled = found.groups()
    assert (int(lost), int(doubled)) == (0, 0), done.stdout
    # The broker and Redis kills pause the random ones while the pipeline recovers (30 s at most each).
    assert int(kills) >= 3 and int(epochs) >= 100, done.stdout
    missing = [name for name, pattern in EVENTS.items() if not pattern.search(done.stdout)]
    assert not missing, f"events that did not happen or were not checked: {missing}\n{done.stdout}"
    assert len(set(KILLED.findall(done.stdout))) >= 2, "kills spread over the processes"
    assert done.returncode == 0, done.stdout
