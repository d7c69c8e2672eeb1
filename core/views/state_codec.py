"""How operator state is encoded as bytes (keys and values), so the caller can persist it anywhere.

State keys are relative to one view (the caller namespaces them, e.g. one Redis hash per view) and are
``<tag><json array of the key's values>``:

- ``g[...]``: an aggregate group, the array holds the GROUP BY values (``g[]`` for a global aggregate);
- ``j0[...]`` / ``j1[...]``: the rows of join side 0 (FROM) / 1 (JOIN) whose join key is the array;
  for the ``i``-th join of a chain (``i >= 1``), ``j<i>.0[...]`` (the rows of the joins before it, per
  source a row or null) and ``j<i>.1[...]`` (the rows of the view it joins);
- ``(<name>)<key>``: a key of the operator nested for a subquery, WITH query or UNION ALL branch
  (``$(x)`` for ``FROM (...) x``, ``$x`` for ``WITH x``, ``$(branch<i>)``), itself one of the above.
- ``t[...]``: the rows of a top-N partition (the array holds the PARTITION BY values), each as
  ``[ORDER BY values, the sources' key, output values]``.

Values are compact JSON (no whitespace). Every value is encoded by its column type, which the plan fixes
per position: ints and strings as themselves, floats as floats (an int in a float column is widened,
so ``1`` and ``1.0`` make the same key), bytes as base64 strings. In keys ``-0.0`` becomes ``0.0``, as
Spark normalises it when grouping and joining.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from mvlog.row_schema import ColumnType

GROUP_TAG = b"g"
JOIN_TAGS = (b"j0", b"j1")
TOP_N_TAG = b"t"


def encode_value(value: Any, kind: ColumnType | None) -> Any:
    """A column value as a JSON-able value (inverse: ``decode_value``)."""
    if value is None:
        return None
    if kind is ColumnType.BYTES:
        return base64.b64encode(bytes(value)).decode("ascii")
    if kind is ColumnType.FLOAT:
        return float(value)
    return value


def decode_value(value: Any, kind: ColumnType | None) -> Any:
    if value is None:
        return None
    if kind is ColumnType.BYTES:
        return base64.b64decode(value)
    if kind is ColumnType.FLOAT:
        return float(value)
    return value


def key_value(value: Any, kind: ColumnType | None) -> Any:
    """``value`` as it identifies a group or join key: floats widened, ``-0.0`` folded into ``0.0``."""
    if value is None:
        return None
    if kind is ColumnType.FLOAT:
        value = float(value)
        return 0.0 if value == 0.0 else value
    if kind is ColumnType.BYTES:
        return bytes(value)
    return value


def encode_key(tag: bytes, values: Sequence[Any], kinds: Sequence[ColumnType | None]) -> bytes:
    """``tag`` + the values as a JSON array; injective for a fixed tag and fixed ``kinds``."""
    encoded = [encode_value(key_value(v, k), k) for v, k in zip(values, kinds, strict=True)]
    return tag + dumps(encoded)


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(data: bytes) -> Any:
    return json.loads(data)
