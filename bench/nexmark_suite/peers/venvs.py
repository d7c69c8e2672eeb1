"""One virtualenv per peer engine, outside the work tree, from the pinned ``requirements/<engine>.txt``.

The peers' Python packages pin their own pyarrow, numpy, protobuf or pyspark; installed beside mvlog they
would fight its pins. Each engine's job runs instead with the interpreter of
``~/.cache/mvlog/peers/<engine>/venv`` (or ``$MVLOG_PEERS_HOME/<engine>/venv``), made on first use (or by
``make bench-peers``) and remade when its requirements file changes (a stamp in the venv holds the text it
was made from). ``python -m bench.nexmark_suite.peers.venvs [ENGINE ...]`` prepares them, and the jars.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from mvlog.infra.maven_jars import cache_folder

PEERS_HOME_ENV = "MVLOG_PEERS_HOME"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements"
ENGINES = ("spark", "quix", "pathway", "flink")
_STAMP = ".mvlog-requirements"


def peers_home() -> Path:
    """``$MVLOG_PEERS_HOME``, else ``~/.cache/mvlog/peers``."""
    return cache_folder(PEERS_HOME_ENV, "peers")


def requirements(engine: str) -> Path:
    path = REQUIREMENTS / f"{engine}.txt"
    if not path.is_file():
        raise ValueError(f"no peer engine {engine!r} (no {path}); the engines are {', '.join(ENGINES)}")
    return path


def pinned_version(engine: str, package: str) -> str:
    """The version ``requirements/<engine>.txt`` pins ``package`` to (``package==X``)."""
    for line in requirements(engine).read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name.strip().lower() == package.lower() and version:
            return version.strip()
    raise ValueError(f"{requirements(engine)} pins no {package}==<version>")


def venv_python(engine: str) -> Path:
    return peers_home() / engine / "venv" / "bin" / "python"


def ensure_venv(engine: str) -> Path:
    """The interpreter of the engine's venv, created and filled when missing or out of date."""
    wanted = requirements(engine).read_text()
    python = venv_python(engine)
    venv = python.parent.parent
    stamp = venv / _STAMP
    if python.exists() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    steps = [[base, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
             [str(python), "-m", "pip", "install", "-q", "-r", str(requirements(engine))]]
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"preparing the {engine} peer's venv failed (`{' '.join(command)}`):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
    stamp.write_text(wanted)
    return python


def main(argv: list[str]) -> int:
    from .jars import flink_jars, spark_jars

    for engine in argv or ENGINES:
        print(f"{engine}: {ensure_venv(engine)}", flush=True)
        if engine == "spark":
            print(f"  jars: {', '.join(p.name for p in spark_jars())}", flush=True)
        if engine == "flink":
            print(f"  jars: {', '.join(p.name for p in flink_jars())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or os.environ.get("MVLOG_PEERS", "").split()))
