"""The Spark worker daemon's path: Spark's archives come off only where the rest of the path provides
their package, and jars always; the collection after each task skips the heap imports made
(mvlog.connectors.spark.worker_daemon)."""

from __future__ import annotations

import gc
import sys
import types
import weakref
import zipfile
from pathlib import Path

import pytest

from mvlog.connectors.spark import worker_daemon
from mvlog.connectors.spark.worker_daemon import TaskEndCollector, redundant_archives


def _archive(path: Path, package: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{package}/__init__.py", "")
    return str(path)


def test_an_archive_goes_only_when_its_package_is_installed_elsewhere(tmp_path: Path) -> None:
    lib, site = tmp_path / "lib", tmp_path / "site"
    lib.mkdir()
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    pyspark_zip = _archive(lib / "pyspark.zip", "pyspark")
    py4j_zip = _archive(lib / "py4j-0.10.9.9-src.zip", "py4j")  # no py4j on the rest of the path: kept
    jar = _archive(lib / "spark-core_2.13-4.3.0.jar", "org")
    other = _archive(lib / "user-code.zip", "mine")  # not Spark's: kept
    path = [str(tmp_path), pyspark_zip, py4j_zip, jar, other, str(site)]
    assert redundant_archives(path) == [jar, pyspark_zip]
    assert redundant_archives([pyspark_zip, py4j_zip, str(tmp_path)]) == []  # Spark's own pyspark only


def test_taking_them_off_also_drops_their_cached_finders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = _archive(tmp_path / "spark-core.jar", "org")
    monkeypatch.setattr(sys, "path", [*sys.path, jar])
    monkeypatch.setattr(sys, "path_importer_cache", {**sys.path_importer_cache, jar: None, jar + "/org": None})
    assert worker_daemon.take_off_archives() == [jar]
    assert jar not in sys.path and not [k for k in sys.path_importer_cache if k.startswith(jar)]


class _Node:
    other: _Node | None = None


def _collectable(obj: object) -> bool:
    """Whether the collector still walks ``obj``: frozen objects are in no generation ``gc.get_objects``
    lists."""
    return any(found is obj for found in gc.get_objects())


def test_the_collection_after_a_task_frees_its_cycles_and_freezes_only_what_imports_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    collector = TaskEndCollector()
    was_enabled = gc.isenabled()
    gc.disable()  # only the collector under test collects
    try:
        collector.collect()  # the first task imported the worker's modules: their heap is frozen
        frozen = gc.get_freeze_count()
        assert frozen > 0

        first, second = _Node(), _Node()
        first.other, second.other = second, first  # a task leaves a cycle and imports nothing
        cycle = weakref.ref(first)
        left: list[list[int]] = [[]]  # and something that lives on
        del first, second
        collector.collect()
        assert cycle() is None
        # Nothing imported: what the task left stays collectable. (Not the freeze count: frozen objects the
        # process frees meanwhile, on pytest-xdist's threads too, take it down.)
        assert _collectable(left)

        monkeypatch.setitem(sys.modules, "mvlog_imported_by_a_task", types.ModuleType("mvlog_imported_by_a_task"))
        kept: list[list[int]] = [[] for _ in range(100)]  # what the importing task's modules hold
        collector.collect()
        assert not _collectable(kept) and not _collectable(kept[0])  # frozen with the import
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
