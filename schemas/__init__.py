"""Avro schemas of everything mvlog puts on the wire, and their codec.

The ``.avsc`` files are the documented contract: any Kafka client can decode mvlog topics with them
(the header ``mvlog.type`` tells whether a value is a ``change`` or a ``barrier``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

from fastavro import parse_schema

SCHEMA_FILES = ("change_event", "barrier", "key", "catalog_entry", "value")


@cache
def load_schema(name: str) -> Any:
    """A parsed (fastavro) schema by file name without ``.avsc``."""
    if name not in SCHEMA_FILES:
        raise KeyError(f"unknown schema {name!r}; known: {', '.join(SCHEMA_FILES)}")
    text = files(__name__).joinpath(f"{name}.avsc").read_text()
    return parse_schema(json.loads(text))
