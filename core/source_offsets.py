"""The record, on a source table's barriers, of how far each epoch consumed its source topic.

The Kafka transaction of the epoch commits the consumer group's offsets and the changelog together;
this mutation repeats those offsets in the changelog itself, so whoever reads the table's changelog (a
restarted ingester checking its group's offsets, a test checking every epoch against the topic) knows
which messages each committed epoch holds without asking the group coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping

from mvlog.changes import Mutation

#: Barrier mutation kind of a source table's epoch.
SOURCE_OFFSETS_MUTATION = "source_offsets"


def offsets_mutation(table: str, topic: str, offsets: Mapping[int, int]) -> Mutation:
    """``offsets``: partition -> next offset to read after the epoch (its messages end just below)."""
    return Mutation(SOURCE_OFFSETS_MUTATION, table,
                    {"topic": topic, "offsets": {str(p): o for p, o in sorted(offsets.items())}})


def offsets_of(mutation: Mutation | None) -> dict[int, int] | None:
    """The partition -> next offset a source epoch's barrier records, None on other barriers."""
    if mutation is None or mutation.kind != SOURCE_OFFSETS_MUTATION:
        return None
    return {int(p): int(o) for p, o in mutation.payload["offsets"].items()}
