"""Compiled bytecode inside pyspark's ``pyspark.zip``, so Spark's Python workers stop compiling pyspark.

Spark starts its Python workers with ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``
(``PythonUtils.sparkPythonPath``), ahead of the venv's site-packages; for a pip-installed pyspark that
zip ships only ``.py`` sources, and ``zipimport`` never writes bytecode back. So **every** new worker
process compiles each pyspark module it imports: measured here, importing ``pyspark.sql`` and the data
source planner costs 0.72-0.76 s of CPU from the zip against 0.26-0.27 s from compiled files. A view's
micro-batch reads through the ``mvlog`` data source start such processes (lookup, planning, the
streaming source runner), so this was most of a small micro-batch's CPU and a large share of the
tests' Spark time.

:func:`add_bytecode` rewrites the zip with a ``.pyc`` beside each ``.py`` (``zipimport`` looks for the
``.pyc`` first). They are **checked hash-based** pycs (PEP 552): an import validates each against its
source's hash in the zip, so an edited source is compiled as before, never served stale; an interpreter
of another version rejects their magic number and compiles the source, as without them. The sources
stay in the zip, so tracebacks show their lines. ``make setup`` runs it after installing pyspark; it is
a no-op on a zip that already holds bytecode of this interpreter.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

#: The entry whose presence says the zip already holds this interpreter's bytecode.
_MARKER = "pyspark/__init__.pyc"
#: PEP 552's flags of a hash-based pyc whose source is checked at import: bit 0 hash-based, bit 1 checked.
_CHECKED_HASH_FLAGS = (0b11).to_bytes(4, "little")


def _checked_hash_pyc(source: bytes, filename: str) -> bytes:
    """A pyc of ``source`` (PEP 552 layout: magic, flags, the source's hash, the marshalled code)."""
    code = compile(source, filename, "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + _CHECKED_HASH_FLAGS + importlib.util.source_hash(source)
            + marshal.dumps(code))


def pyspark_zip() -> Path | None:
    """The ``pyspark.zip`` Spark puts on its Python workers' path, or None (a pyspark without one)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def _holds_current_bytecode(archive: zipfile.ZipFile) -> bool:
    try:
        return archive.read(_MARKER)[:4] == importlib.util.MAGIC_NUMBER
    except KeyError:
        return False


def add_bytecode(path: Path) -> int:
    """Rewrite the zip at ``path`` with a checked hash-based ``.pyc`` beside each ``.py``; returns how
    many it compiled (0 when it already held them). The new zip replaces the old one atomically."""
    with zipfile.ZipFile(path) as source:
        if _holds_current_bytecode(source):
            return 0
        entries = [(info, source.read(info)) for info in source.infolist()
                   if not info.filename.endswith(".pyc")]
    compiled = 0
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".pyspark-", suffix=".zip")
    os.close(fd)
    temporary = Path(name)
    try:
        # Stored, not deflated: every worker reads these entries again; the disk is cheaper than inflating.
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED) as target, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyspark's own SyntaxWarnings, shown again by a source import
            for info, data in entries:
                info.compress_type = zipfile.ZIP_STORED
                target.writestr(info, data)
                if not info.filename.endswith(".py"):
                    continue
                # The name zipimport gives the module's file, so tracebacks point into the zip.
                target.writestr(info.filename[:-3] + ".pyc", _checked_hash_pyc(data, str(path / info.filename)))
                compiled += 1
        temporary.chmod(path.stat().st_mode & 0o777)
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)
    return compiled


def main() -> int:
    path = pyspark_zip()
    if path is None:
        print("pyspark.zip: none in this pyspark (nothing to compile)")
        return 0
    compiled = add_bytecode(path)
    print(f"pyspark.zip: {compiled} modules compiled into {path}" if compiled
          else f"pyspark.zip: bytecode already present ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
