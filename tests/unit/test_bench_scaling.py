"""bench/scaling.py's report: each side's rate per master, and how well mvlog's catch-up in tasks scales from
the first master to the others against the plain job's (issue 19's target: at least 0.8x as well)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

from scaling import main, report  # noqa: E402


def _run(master: str, baseline_s: float, in_tasks_s: float | None) -> dict[str, Any]:
    return {"master": master, "changes": 200_000, "machine": "machine: test",
            "views": {"filter": {"baseline_s": baseline_s, "driver_s": None, "in_tasks_s": in_tasks_s}}}


def test_scaling_factors_and_the_verdict() -> None:
    # the plain job 4.0 s -> 2.0 s (2.00x); in tasks 8.0 s -> 5.0 s (1.60x): 0.80x as well, met
    lines = report([_run("local[1]", 4.0, 8.0), _run("local[2]", 2.0, 5.0)])
    assert "    filter    plain job    50,000 records/s; in tasks    25,000 changes/s, 0.50x the plain job" in lines
    assert "    filter    plain job   100,000 records/s; in tasks    40,000 changes/s, 0.40x the plain job" in lines
    assert lines[-2] == ("    filter    plain job 2.00x, in tasks 1.60x: mvlog scales 0.80x as well as the plain "
                         "job (target >= 0.8x: met)")
    assert lines[-1] == "ratio mvlog's scaling / the plain job's, local[2] over local[1]: filter 0.80x (target >= 0.8x)"
    # in tasks 8.0 s -> 6.0 s (1.33x): 0.67x as well, not met
    assert report([_run("local[1]", 4.0, 8.0), _run("local[2]", 2.0, 6.0)])[-2].endswith("0.67x as well as the "
                                                                                          "plain job (target >= "
                                                                                          "0.8x: not met)")


def test_a_view_not_run_in_tasks_has_no_factor() -> None:
    lines = report([_run("local[1]", 4.0, None), _run("local[2]", 2.0, None)])
    assert "    filter    plain job    50,000 records/s; in tasks: not run" in lines
    assert lines[-2:] == ["  local[2] over local[1]:",
                          "ratio mvlog's scaling / the plain job's, local[2] over local[1]: none in tasks "
                          "(target >= 0.8x)"]


@pytest.mark.parametrize("argv", [["--masters", "local[2]"], ["--", "--master", "local[4]", "--tasks"],
                                  ["--", "--live-epochs", "0"]])
def test_refused_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
