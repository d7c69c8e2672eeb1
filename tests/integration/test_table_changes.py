"""The changes a table writer derives from its writes and the rows in Redis (before-images).

The writer compares the new row's encoding with the stored one and decodes the stored row only when the
bytes differ; the changelog must say exactly what comparing rows says: nothing for a rewrite of the same
row (also 0.0 rewritten as -0.0, equal as numbers), an update with the stored row as ``before``, a delete
with it, a create with no ``before``, and nothing for a delete of a key without a row.
"""

from __future__ import annotations

import redis

from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.services.tables.writer import Table

COLUMNS = {"id": "int", "name": "string", "price": "float", "note": "string"}


def _epochs(settings: Settings, table: Table) -> dict[int, list[Change]]:
    with ChangelogReader(settings, "t", ["id"], settings.partitions, table.store.index) as reader:
        return {e.epoch: sorted(e.changes, key=lambda c: c.key) for e in reader.epochs(idle_timeout=2)}


def test_changes_are_those_of_comparing_rows(settings: Settings, redis_client: redis.Redis) -> None:
    table = Table.create(settings, "t", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    rows = [{"id": i, "name": f"n{i}", "price": 0.0, "note": None} for i in range(4)]
    table.upsert(rows)
    first = table.flush()
    table.upsert([dict(r) for r in rows[:2]])  # the same rows again
    table.upsert([{"id": 2, "name": "n2", "price": -0.0, "note": None}])  # equal as a row
    table.upsert([{"id": 3, "name": "n3", "price": 1, "note": "x"}])  # an update (int price normalized)
    table.delete([0, 99])  # a row, and a key without one
    table.upsert([{"id": 4, "name": "n4", "price": 2.5, "note": None}])
    second = table.flush()
    table.close()

    epochs = _epochs(settings, table)
    assert [c.op for c in epochs[first]] == [Op.CREATE] * 4
    assert epochs[second] == [
        Change(Op.DELETE, (0,), rows[0], None),
        Change(Op.UPDATE, (3,), rows[3], {"id": 3, "name": "n3", "price": 1.0, "note": "x"}),
        Change(Op.CREATE, (4,), None, {"id": 4, "name": "n4", "price": 2.5, "note": None}),
    ]
    assert table.store.row_count("t") == 4
