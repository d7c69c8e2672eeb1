"""The daemon of mvlog's Spark sessions preloads modules that exist: a name left behind by a rename would stop
every Python worker of every session from starting (mvlog.services.spark.daemon)."""

from __future__ import annotations

import importlib.util

import pytest

from mvlog.services.spark.daemon import TASK_MODULES


@pytest.mark.parametrize("module", TASK_MODULES)
def test_each_preloaded_module_is_installed(module: str) -> None:
    assert importlib.util.find_spec(module) is not None
