"""Typed values as they appear on the command line (``--key 42``) and in JSON (rows read and printed).

JSON has no bytes: a ``bytes`` column is base64 text in JSON input and output, and on the command line.
Everything else maps directly (JSON numbers, strings, booleans, null); the row schema then validates
the values (an int column refuses ``1.5`` and ``true``).

Numeric options (epochs, ports, partitions, counts, seconds) all go through :class:`Bounded`, so each is
range-checked once, with the same wording, before any command code sees it.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

import click

from mvlog.epoch import MAX_EPOCH
from mvlog.row_schema import INT64_MAX, Column, ColumnType, Key, Row, RowSchema

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


# ------------------------------------------------------------------------------------ numeric options


class Bounded(click.ParamType):
    """An int or a float option within ``[low, high]`` (inclusive; floats also finite).

    Out-of-range values are refused here with what the option is and its range, because the code behind
    an option fails on them far from the command line: an epoch above int64 ended ``replay`` with
    ``ValueError: year 50323 is out of range``, ``nan`` seconds never time out.
    """

    def __init__(self, kind: type[int] | type[float], low: float, high: float, what: str) -> None:
        self.kind = kind
        self.low = low
        self.high = high
        self.what = what
        self.name = kind.__name__  # the metavar click shows: INT, FLOAT

    def range(self) -> str:
        return f"{self.what}, from {self.low:g} to {self.high:g}" if self.kind is float else \
            f"{self.what}, from {self.low} to {self.high}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number: int | float = self.kind(value)  # a default given in code
        else:
            try:
                number = self.kind(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not {'an integer' if self.kind is int else 'a number'}: expected "
                          f"{self.range()}", param, ctx)
        if not (math.isfinite(number) and self.low <= number <= self.high):
            self.fail(f"{value} is out of range: expected {self.range()}", param, ctx)
        return number


_A_YEAR_S = 366 * 24 * 3600.0  # no wait or duration of a command is longer; sleep() overflows far above

EPOCH = Bounded(int, 0, MAX_EPOCH, "an epoch (int64)")
PORT = Bounded(int, 1, 65535, "a TCP port")
PORT_OR_ANY = Bounded(int, 0, 65535, "a TCP port (0: any free one)")
PARTITIONS = Bounded(int, 1, 256, "a partition count")
SECONDS = Bounded(float, 0.0, _A_YEAR_S, "seconds")


def count(low: int, what: str, high: int = INT64_MAX) -> Bounded:
    """A whole number of something (rows, epochs, samples) from ``low`` to ``high``."""
    return Bounded(int, low, high, what)


def seconds(low: float, what: str = "seconds") -> Bounded:
    """Seconds from ``low`` (a polling interval has a floor) to a year."""
    return Bounded(float, low, _A_YEAR_S, what)
