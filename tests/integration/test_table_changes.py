"""The changes a table writer derives from its writes and the rows in Redis (before-images).

The writer compares the new row's encoding with the stored one and decodes the stored row only when the
bytes differ; the changelog must say exactly what comparing rows says: nothing for a rewrite of the same
row (also 0.0 rewritten as -0.0, equal as numbers), an update with the stored row as ``before``, a delete
with it, a create with no ``before``, and nothing for a delete of a key without a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest.mock import ANY

import pytest
import redis

from mvlog.changes import Change, Op
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.services.table_writer import Table

pytestmark = pytest.mark.integration

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


def _seeded(table: Table) -> bool:
    return table._encoder.presence is not None


def _hmget_fields(monitor: Any, rows_key: str, marker: str) -> int:
    """Fields asked by every HMGET of ``rows_key`` that MONITOR showed until ``marker`` was echoed."""
    fields = 0
    for command in monitor.listen():
        words = command["command"].split(" ")
        if words[0] == "ECHO" and words[1:] == [marker]:
            return fields
        if words[0] == "HMGET" and words[1] == rows_key:
            fields += len(words) - 2
    raise AssertionError("MONITOR ended before the marker")


def test_a_writer_reads_before_images_only_of_keys_its_table_may_hold(settings: Settings,
                                                                      redis_client: redis.Redis) -> None:
    """The key-presence filter (mvlog.key_presence): a new writer seeds it from the table's keys, so updates
    and deletes of existing rows still find their before-images, while keys the table never held are not
    read at all (or a few of them: the filter's false "maybe")."""
    table = Table.create(settings, "t", COLUMNS, ["id"], client=redis_client, auto_commit=False)
    rows = [{"id": i, "name": f"n{i}", "price": float(i), "note": None} for i in range(50)]
    table.upsert(rows)
    table.flush()
    table.close()

    table = Table.open(settings, "t", client=redis_client, auto_commit=False)  # seeds at its first epoch
    table.upsert([{**rows[i], "name": f"m{i}"} for i in range(10)])
    table.upsert([{"id": i, "name": f"n{i}", "price": 1.0, "note": "new"} for i in range(100, 130)])
    table.delete([40, 41, 999])
    rows_key, marker = f"{settings.topic_prefix}:{{t}}:rows", f"end-{settings.topic_prefix}"
    with redis_client.monitor() as monitor:  # type: ignore[no-untyped-call]
        epoch = table.flush()
        redis_client.echo(marker)
        asked = _hmget_fields(monitor, rows_key, marker)
    table.upsert([{"id": 100, "name": "again", "price": 1.0, "note": None}])  # a key the last epoch created
    again = table.flush()
    table.close()

    epochs = _epochs(settings, table)
    assert epochs[epoch] == (
        [Change(Op.UPDATE, (i,), rows[i], {**rows[i], "name": f"m{i}"}) for i in range(10)]
        + [Change(Op.DELETE, (i,), rows[i], None) for i in (40, 41)]
        + [Change(Op.CREATE, (i,), None, {"id": i, "name": f"n{i}", "price": 1.0, "note": "new"})
           for i in range(100, 130)])
    assert epochs[again] == [Change(Op.UPDATE, (100,), {"id": 100, "name": "n100", "price": 1.0, "note": "new"},
                                    {"id": 100, "name": "again", "price": 1.0, "note": None})]
    assert 12 <= asked <= 12 + 5  # the 12 existing keys; of the 31 others, only false "maybe"s (~1 % each)
    assert table.store.row_count("t") == 78


def test_a_wiped_redis_never_seeds_the_filter(make_settings: Callable[..., Settings], own_redis: str) -> None:
    """Seeded from a Redis that does not hold the writer's MCE (wiped, or being rebuilt), the filter would
    miss keys and turn updates into creates: it is seeded only from the rows of that MCE, read with it."""
    settings = make_settings(redis_url=own_redis)
    client = redis.Redis.from_url(own_redis)
    table = Table.create(settings, "t", COLUMNS, ["id"], client=client, auto_commit=False)
    rows = [{"id": i, "name": f"n{i}", "price": 0.5, "note": None} for i in range(20)]
    table.upsert(rows)
    first = table.flush()
    client.flushall()  # before the writer's next epoch: its filter is not seeded yet (first epoch of a reopen)
    table.close()
    table = Table.open(settings, "t", client=client, auto_commit=False)  # rebuilds Redis from Kafka
    encoder = table._encoder
    assert not _seeded(table)
    client.flushall()  # the wipe again, now with the writer running: Redis holds no MCE
    assert encoder.changes({(3,): {**rows[3], "name": "x"}}, table._committer.mce) == [
        (ANY, "c", None, ANY, (3,))]  # what a wiped Redis says (the committer checks the MCE around this)
    assert not _seeded(table)  # ... and the filter was not seeded from it
    table.upsert([{**rows[3], "name": "x"}, {"id": 77, "name": "n77", "price": 0.5, "note": None}])
    second = table.flush()  # the committer rebuilds Redis from Kafka, then the filter is seeded from it
    assert _seeded(table)
    table.close()
    epochs = _epochs(settings, table)
    assert [c.op for c in epochs[first]] == [Op.CREATE] * 20
    assert epochs[second] == [Change(Op.UPDATE, (3,), rows[3], {**rows[3], "name": "x"}),
                              Change(Op.CREATE, (77,), None, {"id": 77, "name": "n77", "price": 0.5, "note": None})]
    client.close()
