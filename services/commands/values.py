"""Typed values as they appear on the command line (``--key 42``) and in JSON (rows read and printed).

JSON has no bytes: a ``bytes`` column is base64 text in JSON input and output, and on the command line.
Everything else maps directly (JSON numbers, strings, booleans, null); the row schema then validates
the values (an int column refuses ``1.5`` and ``true``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from mvlog.row_schema import Column, ColumnType, Key, Row, RowSchema

_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}

Problem = tuple[str, str]  # (field, what is wrong)


def parse_text(column: Column, text: str) -> Any:
    """``text`` (a command-line argument) as a value of ``column``; ValueError saying what was expected."""
    kind = column.type
    try:
        match kind:
            case ColumnType.INT:
                return int(text)
            case ColumnType.FLOAT:
                return float(text)
            case ColumnType.BOOLEAN:
                if text.strip().lower() in _TRUE:
                    return True
                if text.strip().lower() in _FALSE:
                    return False
                raise ValueError
            case ColumnType.BYTES:
                return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        expected = {ColumnType.BOOLEAN: "true or false", ColumnType.BYTES: "base64 text"}.get(kind, kind.value)
        raise ValueError(f"{column.name} is {kind.value}: expected {expected}, got {text!r}") from None
    return text


def _from_json(column: Column, value: Any) -> tuple[Any, str | None]:
    if column.type is ColumnType.BYTES and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True), None
        except (ValueError, binascii.Error):
            return value, "bytes column: expected base64 text"
    return value, None


def row_from_json(schema: RowSchema, data: Any) -> tuple[Any, list[Problem]]:
    """A decoded JSON line as a row (bytes columns decoded); the schema validates the rest."""
    if not isinstance(data, Mapping):
        return data, []  # the schema's validation names the problem (expected a mapping)
    row: Row = dict(data)
    problems: list[Problem] = []
    for name, value in data.items():
        if value is not None and name in schema.names:
            row[name], problem = _from_json(schema.column(name), value)
            if problem:
                problems.append((name, problem))
    return row, problems


def key_from_json(schema: RowSchema, data: Any) -> tuple[Key | None, list[Problem]]:
    """A decoded JSON line naming a primary key: ``{"id": 1}`` (a full row too: other columns are
    ignored), ``[1, "a"]`` (the key's values in key order) or ``1`` (a one-column key)."""
    pk = schema.primary_key
    key_field = ",".join(pk)
    if isinstance(data, Mapping):
        unknown = [(name, "unknown column") for name in data if name not in schema.names]
        missing = [(name, "primary key column is missing") for name in pk if name not in data]
        if unknown or missing:
            return None, unknown + missing
        values = [data[name] for name in pk]
    elif isinstance(data, list):
        if len(data) != len(pk):
            return None, [(key_field, f"expected {len(pk)} key value(s) ({key_field}), got {len(data)}")]
        values = list(data)
    elif len(pk) == 1:
        values = [data]
    else:
        return None, [(key_field, f"a key of {len(pk)} columns is an object or an array, got {data!r}")]
    key: list[Any] = []
    problems: list[Problem] = []
    for name, value in zip(pk, values, strict=True):
        converted, problem = _from_json(schema.column(name), value)
        key.append(converted)
        if problem:
            problems.append((name, problem))
    return tuple(key), problems


def to_json(value: Any) -> Any:
    """A row value as JSON (bytes as base64 text)."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return value
