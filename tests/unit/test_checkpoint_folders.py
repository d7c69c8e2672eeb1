"""A streaming query's checkpoint folder outlives a SIGKILLed consumer; the next start deletes it, and
never the folder of a process still running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mvlog.services.pipeline.streaming import CHECKPOINT_PREFIX, remove_dead_checkpoints


def test_the_folders_of_dead_processes_are_removed_and_the_living_ones_kept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = tmp_path / f"{CHECKPOINT_PREFIX}{gone.stdout.strip()}-mv1-abc"
    alive = tmp_path / f"{CHECKPOINT_PREFIX}{os.getpid()}-mv2-def"
    other = tmp_path / "mvlog-pg-123"  # not a checkpoint folder
    for folder in (dead, alive, other):
        (folder / "offsets").mkdir(parents=True)
    assert remove_dead_checkpoints(tmp_path) == 1
    assert not dead.exists() and alive.exists() and other.exists()
