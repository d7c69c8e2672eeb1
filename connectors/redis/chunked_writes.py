"""Writes of many hash fields or set members, sent as commands of bounded size.

A staged rebuild, hydration or partition holds up to a view's whole state: one ``HSET`` of a million
fields is one request the server parses and runs at once, blocking every other client meanwhile. Chunks
keep each command small; on a pipeline they still go back to back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Fields or members per command: big enough to be cheap, small enough not to stall the server.
CHUNK = 4096


def hset_chunked(client: Any, key: str | bytes, mapping: Mapping[bytes, bytes], chunk: int = CHUNK) -> None:
    """``HSET key`` of every field of ``mapping``, ``chunk`` fields a command (``client``: a client or a
    pipeline)."""
    items = list(mapping.items())
    for start in range(0, len(items), chunk):
        client.hset(key, mapping=dict(items[start:start + chunk]))


def sadd_chunked(client: Any, key: str | bytes, members: Sequence[bytes], chunk: int = CHUNK) -> None:
    """``SADD key`` of every one of ``members``, ``chunk`` a command."""
    for start in range(0, len(members), chunk):
        client.sadd(key, *members[start:start + chunk])


def zadd_chunked(client: Any, key: str | bytes, members: Sequence[bytes], chunk: int = CHUNK) -> None:
    """``ZADD key`` of every one of ``members`` with score 0 (a key-order index: ordered by member),
    ``chunk`` a command."""
    for start in range(0, len(members), chunk):
        client.zadd(key, dict.fromkeys(members[start:start + chunk], 0))
