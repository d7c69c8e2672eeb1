"""Messages of a source topic, the row changes they decode to, and JSON values as typed column values.

Every decoder (:mod:`mvlog.source_formats`) turns a :class:`SourceMessage` into :class:`RowChange` s
through :func:`typed_row` / :func:`typed_key`, so the conversion rules and the error naming a bad
record (topic, partition, offset, field) are the same for every format.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mvlog.row_schema import INT64_MAX, INT64_MIN, Column, ColumnType, Key, Row, RowSchema


@dataclass(frozen=True, slots=True)
class SourceMessage:
    """One record of the source topic as the consumer returned it (key and value bytes, None for null)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class RowChange:
    """A change of the table: ``row`` replaces the whole row of ``key``, or ``row is None`` deletes it.

    ``position`` orders the streamed changes of one key at their origin when the format carries such a
    position (Debezium's PostgreSQL ``lsn``, :func:`mvlog.source_dedupe.debezium_position`): a change at
    or below the key's last applied position is a redelivery (:class:`mvlog.source_dedupe.PositionFilter`).
    """

    key: Key
    row: Row | None
    position: int | None = None

    @property
    def is_delete(self) -> bool:
        return self.row is None


class BadRecordError(ValueError):
    """A message that cannot become a change of the table; says where it is and what is wrong."""

    def __init__(self, message: SourceMessage, field: str | None, problem: str) -> None:
        self.where = message.where
        self.field = field
        self.problem = problem
        what = f"field {field!r}: " if field else ""
        super().__init__(f"bad record {self.where}: {what}{problem}")


def typed_value(column: Column, value: Any) -> Any:
    """A JSON value as a value of ``column``; ValueError saying what was expected.

    JSON has no bytes and no int/float distinction the producer can always control, so: a bytes column
    takes base64 text (Debezium's JSON encoding of bytes), an int column an integral number, a float
    column any number or numeric text (Debezium's ``decimal.handling.mode=string``).
    """
    if value is None:
        return None
    kind = column.type
    if kind is ColumnType.INT:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected int, got {_shown(value)}")
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"int {value} does not fit in 64 bits")
        return value
    if kind is ColumnType.FLOAT:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"expected a number, got {_shown(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {_shown(value)}")
        number = float(value)
        if math.isnan(number):
            raise ValueError("NaN is not allowed")
        return number
    if kind is ColumnType.STRING:
        if not isinstance(value, str):
            raise ValueError(f"expected string, got {_shown(value)}")
        return value
    if kind is ColumnType.BOOLEAN:
        if not isinstance(value, bool):
            raise ValueError(f"expected boolean, got {_shown(value)}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"bytes column: expected base64 text, got {_shown(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("bytes column: expected base64 text") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def typed_row(schema: RowSchema, data: Any, message: SourceMessage, what: str = "value") -> Row:
    """A JSON object as a full row of ``schema`` in column order (fields the schema lacks are ignored:
    a table may keep a subset of a topic's fields; missing nullable columns are NULL)."""
    if not isinstance(data, Mapping):
        raise BadRecordError(message, None, f"the {what} is not a JSON object but {_shown(data)}")
    row: Row = {}
    for column in schema.columns:
        try:
            value = typed_value(column, data.get(column.name))
        except ValueError as error:
            raise BadRecordError(message, column.name, str(error)) from None
        if value is None and not column.nullable:
            kind = "primary key column" if column.name in schema.primary_key else "column"
            raise BadRecordError(message, column.name, f"{kind} is missing or null in the {what}")
        row[column.name] = value
    return row


def typed_key(schema: RowSchema, data: Any, message: SourceMessage, what: str = "key") -> Key:
    """A primary key from JSON: an object with the key columns, or a bare value for a one-column key."""
    pk = schema.primary_key
    if isinstance(data, Mapping):
        values = []
        for name in pk:
            if data.get(name) is None:
                raise BadRecordError(message, name, f"primary key column is missing or null in the {what}")
            values.append(data[name])
    elif len(pk) == 1 and data is not None and not isinstance(data, list):
        values = [data]
    else:
        raise BadRecordError(message, ",".join(pk), f"the {what} must be a JSON object with {', '.join(pk)}"
                             f"{' or a bare value' if len(pk) == 1 else ''}, got {_shown(data)}")
    key = []
    for name, value in zip(pk, values, strict=True):
        try:
            key.append(typed_value(schema.column(name), value))
        except ValueError as error:
            raise BadRecordError(message, name, f"{error} (in the {what})") from None
    return tuple(key)
