"""Numeric command-line options are range-checked where they are parsed: a clear usage error (exit code 2)
naming the option and its range, never a traceback from deeper code (``year 50323 is out of range``)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mvlog.services.cli import main

# Nothing here may reach a broker or Redis: the values are refused before any connection.
_ENV = {"MVLOG_REDIS_URL": "redis://127.0.0.1:1/0", "MVLOG_BOOTSTRAP_SERVERS": "127.0.0.1:1"}


@pytest.mark.parametrize(("args", "expected"), [
    (["replay", "redeliver", "mv1", "-g", "g", "--to-epoch", "99999999999999999999"],
     "'--to-epoch': 99999999999999999999 is out of range: expected an epoch (int64), from 0 to 9223372036854775807"),
    (["replay", "redeliver", "mv1", "-g", "g", "--to-epoch", "-1"], "-1 is out of range: expected an epoch"),
    (["replay", "derive", "mv1", "--from-epoch", "1.5"], "'1.5' is not an integer: expected an epoch (int64)"),
    (["replay", "redeliver", "mv1", "-g", "g", "--by-duration", "99999999999d"], "outside the time that epochs span"),
    (["replay", "redeliver", "mv1", "-g", "g", "--by-duration", "9" * 400 + "d"], "duration too large"),
    (["replay", "redeliver", "mv1", "-g", "g", "--to-datetime", "9999-01-01"], "outside the time that epochs span"),
    (["up", "--kafka-port", "70000"], "70000 is out of range: expected a TCP port, from 1 to 65535"),
    (["up", "--timeout", "nan"], "nan is out of range: expected seconds, from 0 to 3.16224e+07"),
    (["up", "--timeout", "-1"], "-1 is out of range: expected seconds"),
    (["status", "--watch", "inf"], "inf is out of range: expected seconds, from 0.1"),
    (["create-table", "t", "-c", "id:int", "-k", "id", "--partitions", "0"],
     "expected a partition count, from 1 to 256"),
    (["alter-view", "mv1", "--max-epoch-lag", "-3"], "-3 is out of range: expected epochs, from 0 to"),
    (["snapshot", "mv1", "--keep", "0"], "0 is out of range: expected snapshots, from 1 to"),
    (["run-view", "mv1", "--progress-interval", "-0.5"], "-0.5 is out of range: expected seconds"),
    (["dashboard", "--port", "65536"], "65536 is out of range: expected a TCP port (0: any free one)"),
])
def test_numeric_options_out_of_range_are_refused_with_their_range(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args, env=_ENV)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr, result.stderr
    assert isinstance(result.exception, SystemExit), result.exception  # a usage error, not a crash


def test_numeric_options_in_range_are_accepted() -> None:
    """The edge values themselves pass the check (the command then fails on the dead Redis, exit 1)."""
    result = CliRunner().invoke(main, ["replay", "redeliver", "mv1", "-g", "g", "--to-epoch", str((1 << 63) - 1)],
                                env=_ENV)
    assert result.exit_code == 1 and "out of range" not in result.stderr, result.output
