"""Which Spark drivers get mvlog's JIT setting: only a driver whose executors are JVMs of their own."""

from __future__ import annotations

import pytest

from mvlog.services.spark.session import executors_in_driver


@pytest.mark.parametrize("master", ["local", "local[1]", "local[2]", "local[*]", "local[2,3]"])
def test_local_mode_runs_the_executors_in_the_driver(master: str) -> None:
    assert executors_in_driver(master)


@pytest.mark.parametrize("master", ["local-cluster[2,1,1024]", "spark://10.0.0.5:7077", "yarn",
                                    "k8s://https://10.0.0.1:6443"])
def test_other_masters_run_them_apart(master: str) -> None:
    assert not executors_in_driver(master)
