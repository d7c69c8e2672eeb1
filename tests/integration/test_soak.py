"""The CI's short chaos soak (bench/soak.py): random SIGKILLs, then the oracle at every committed epoch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"soak: ([\d.]+) minutes, (\d+) kills survived, (\d+) epochs checked, "
                     r"rows lost (\d+), rows doubled (\d+)")


def test_short_soak_loses_and_doubles_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2", "--kill-every", "12"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    found = SUMMARY.search(done.stdout)
    assert found, f"no summary line (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with capsys.disabled():  # the soak's line goes to the CI log
        print(f"\n{found.group(0)}")
    _minutes, kills, epochs, lost, doubled = found.groups()
    assert (int(lost), int(doubled)) == (0, 0), done.stdout
    assert int(kills) >= 5 and int(epochs) >= 100, done.stdout
    assert done.returncode == 0, done.stdout
