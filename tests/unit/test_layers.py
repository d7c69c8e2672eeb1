"""The layers import one way, core <- connectors <- services (docs/architecture.md, section 1).

``core`` (installed as ``mvlog``) is pure: no Kafka, Redis, Spark, Faust or HTTP client, and none of
mvlog's I/O layers; ``schemas`` sits beside it; ``connectors`` never reaches up into ``services``. Read
from the source with ``ast`` (imports inside functions included), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IO_CLIENTS = ("confluent_kafka", "redis", "pyspark", "faust", "aiohttp", "aiokafka")

#: folder -> module prefixes it must not import
FORBIDDEN = {
    "core": ("mvlog.connectors", "mvlog.services", "mvlog.infra", *IO_CLIENTS),
    "schemas": ("mvlog.connectors", "mvlog.services", "mvlog.infra", *IO_CLIENTS),
    "connectors": ("mvlog.services",),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in files for line, module in imported_modules(path)
             if any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN[folder])]
    assert not wrong, f"{folder}/ imports from a layer above it or an I/O client:\n" + "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def late():\n    from mvlog.services.cli import main\n    import redis\n")
    assert imported_modules(sample) == [(2, "mvlog.services.cli"), (3, "redis")]
