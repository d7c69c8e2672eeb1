"""Names of tables, views and columns: SQL identifiers (views refer to them unquoted in their SQL), which
are also valid in Kafka topic names (``<prefix>.<view>.changelog``) and Redis keys."""

from __future__ import annotations

import re

import click

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_LENGTH = 128


def check_name(name: str, what: str) -> str:
    """``name`` unchanged, or a clean error saying what a name may hold."""
    if not _NAME.match(name) or len(name) > MAX_LENGTH:
        raise click.BadParameter(f"{what} name {name!r} must be letters, digits and _, not starting with a "
                                 f"digit, at most {MAX_LENGTH} characters")
    return name
