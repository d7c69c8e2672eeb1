"""The record, on a source table's barriers, of how far each epoch consumed its source topic.

The Kafka transaction of the epoch commits the consumer group's offsets and the changelog together;
this mutation repeats those offsets in the changelog itself, so whoever reads the table's changelog (a
restarted ingester checking its group's offsets, a test checking every epoch against the topic) knows
which messages each committed epoch holds without asking the group coordinator.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

from mvlog.changes import Mutation
from mvlog.row_schema import Key

#: Barrier mutation kind of a source table's epoch.
SOURCE_OFFSETS_MUTATION = "source_offsets"


def offsets_mutation(table: str, topic: str, offsets: Mapping[int, int],
                     positions: Mapping[Key, int] | None = None, dead_letters: int = 0) -> Mutation:
    """``offsets``: partition -> next offset to read after the epoch (its messages end just below).
    ``positions``: the source positions the epoch applied, per key (Debezium redelivery, see
    :mod:`mvlog.source_dedupe`), committed with the epoch so a restarted ingester knows them.
    ``dead_letters``: how many bad records the table dead-lettered up to and including this epoch (a
    running total committed with the epoch, like its dead-letter records, so a count shown after a
    SIGKILL or a Redis wipe is exact: it restarts from the last committed barrier, never re-adds)."""
    payload: dict[str, Any] = {"topic": topic, "offsets": {str(p): o for p, o in sorted(offsets.items())}}
    if dead_letters:
        payload["dead_letters"] = dead_letters
    if positions:
        payload["positions"] = [[[_json_value(v) for v in key], position] for key, position in positions.items()]
    return Mutation(SOURCE_OFFSETS_MUTATION, table, payload)


def _json_value(value: Any) -> Any:
    """A key column's value in JSON: bytes as ``{"b64": ...}`` (the only key type JSON has no form for)."""
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def _key_value(value: Any) -> Any:
    return base64.b64decode(value["b64"]) if isinstance(value, dict) else value


def positions_of(mutation: Mutation | None) -> Iterator[tuple[Key, int]]:
    """The (key, position) pairs a source epoch's barrier records (none on other barriers)."""
    if mutation is None or mutation.kind != SOURCE_OFFSETS_MUTATION:
        return
    for key, position in mutation.payload.get("positions", ()):
        yield tuple(_key_value(v) for v in key), int(position)


def offsets_of(mutation: Mutation | None) -> dict[int, int] | None:
    """The partition -> next offset a source epoch's barrier records, None on other barriers."""
    if mutation is None or mutation.kind != SOURCE_OFFSETS_MUTATION:
        return None
    return {int(p): int(o) for p, o in mutation.payload["offsets"].items()}


def dead_letters_of(mutation: Mutation | None) -> int:
    """The running total of dead-lettered records a source epoch's barrier records (0 on other barriers)."""
    if mutation is None or mutation.kind != SOURCE_OFFSETS_MUTATION:
        return 0
    return int(mutation.payload.get("dead_letters", 0))
