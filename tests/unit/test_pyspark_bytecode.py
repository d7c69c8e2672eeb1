"""infra/pyspark_bytecode: the bytecode it adds to a zip is what zipimport loads, and never stale."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from mvlog.infra.pyspark_bytecode import add_bytecode


def _zip(path: Path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)


def _import(path: Path, module: str) -> list[str]:
    """``module.__file__`` and ``module.VALUE`` as a fresh interpreter imports them from the zip."""
    code = f"import sys; sys.path.insert(0, {str(path)!r}); import {module} as m; print(m.__file__); print(m.VALUE)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_imports_come_from_the_added_bytecode(tmp_path: Path) -> None:
    archive = tmp_path / "pyspark.zip"
    _zip(archive, {"pyspark/__init__.py": "VALUE = 1\n", "pyspark/sql/__init__.py": "VALUE = 2\n",
                   "pyspark/data.txt": "not code"})
    archive.chmod(0o644)

    assert add_bytecode(archive) == 2
    assert add_bytecode(archive) == 0  # already there: nothing rewritten

    with zipfile.ZipFile(archive) as done:
        names = set(done.namelist())
        assert done.read("pyspark/data.txt") == b"not code"
    assert {"pyspark/__init__.py", "pyspark/__init__.pyc", "pyspark/sql/__init__.pyc"} <= names
    assert archive.stat().st_mode & 0o777 == 0o644
    file, value = _import(archive, "pyspark.sql")
    assert file.endswith("pyspark/sql/__init__.pyc") and value == "2"


def test_an_edited_source_wins_over_its_bytecode(tmp_path: Path) -> None:
    archive = tmp_path / "pyspark.zip"
    _zip(archive, {"pyspark/__init__.py": "VALUE = 1\n"})
    add_bytecode(archive)
    with zipfile.ZipFile(archive) as old:
        entries = {name: old.read(name) for name in old.namelist()}
    entries["pyspark/__init__.py"] = b"VALUE = 3\n"  # the source changed, its .pyc did not
    with zipfile.ZipFile(archive, "w") as new:
        for name, data in entries.items():
            new.writestr(name, data)

    assert _import(archive, "pyspark")[1] == "3"
