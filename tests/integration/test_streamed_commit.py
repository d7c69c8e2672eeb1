"""An epoch's Redis commit sent while the epoch is written to Kafka, applied at once after it: queued
(MULTI) for a view with rows, written under staged keys and renamed into place for a view without.

What must hold as with the commit script: nothing is visible before :meth:`StreamedCommit.finish`; an
epoch at or below the MCE is refused; a MCE that is not the one the epoch follows raises
ServingStateLostError; a writer killed between the Kafka commit and the Redis commit leaves Redis at the
old epoch and nothing staged stays; the next writer of the table rolls Redis forward over that epoch (a
table's epoch is final once Kafka committed it: a source table's transaction committed its input offsets).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import IndexEntry
from mvlog.connectors.redis.streamed_commit import CHUNK
from mvlog.connectors.redis.view_store import EpochCommit, Lifecycle, ServingStateLostError, ViewStore
from mvlog.schemas.codec import decode_row, encode_key
from mvlog.services.tables.writer import Table

ROOT = Path(__file__).resolve().parents[2]


def _rows(first: int, count: int) -> list[bytes]:
    flat: list[bytes] = []
    for i in range(first, first + count):
        flat += [f"k{i}".encode(), f"v{i}".encode()]
    return flat


def test_nothing_is_visible_until_finish_then_everything_is(settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.commit("v", EpochCommit(10, {b"k0": b"old", b"gone": b"x"}, [], {0: IndexEntry(10, 1, 2)},
                                         order_puts=[b"m0", b"mgone"]))
    staged = store.stream_commit("v", 11, follows=10)
    count = 3 * CHUNK + 5  # several queued chunks and a remainder
    staged.row_kv += _rows(0, count)
    staged.order_puts += [f"m{i}".encode() for i in range(count)]
    staged.row_deletes.append(b"gone")
    staged.order_deletes.append(b"mgone")
    staged.send()
    # Queued, not applied: readers (other connections) still see epoch 10.
    assert store.mce("v") == 10 and store.row_count("v") == 2
    assert store.get_rows("v", [b"k0", b"k1"]) == {b"k0": b"old"}

    assert staged.finish({0: IndexEntry(11, 9, count), 1: IndexEntry(11, 4, 0)})
    assert store.mce("v") == 11 and store.row_count("v") == count
    assert store.get_rows("v", [b"k0", b"gone", f"k{count - 1}".encode()]) == {
        b"k0": b"v0", f"k{count - 1}".encode(): f"v{count - 1}".encode()}
    assert redis_client.zcard(store.key("v", "keyorder")) == count
    assert [e.offset for e in store.index.between("v", 0, 0, 100)] == [1, 9]
    assert [e.offset for e in store.index.between("v", 1, 0, 100)] == [4]
    assert redis_client.ping()  # the pool's connections are usable afterwards


def test_an_aborted_epoch_leaves_nothing(settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    staged = store.stream_commit("v", 5, follows=0)
    staged.row_kv += _rows(0, CHUNK + 1)
    staged.send()
    staged.abort()
    assert store.mce("v") is None and store.row_count("v") == 0
    assert _staged_keys(redis_client, store) == []
    # The next epoch of the same view goes through.
    staged = store.stream_commit("v", 6, follows=0)
    staged.row_kv += _rows(0, 3)
    assert staged.finish({0: IndexEntry(6, 0, 3)})
    assert store.mce("v") == 6 and store.row_count("v") == 3


def test_a_meta_write_meanwhile_falls_back_to_the_script(settings: Settings, redis_client: redis.Redis) -> None:
    """A lifecycle change touches the watched meta: EXEC applies nothing and the script commits instead."""
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.commit("v", EpochCommit(4, {b"a": b"1"}, [], {0: IndexEntry(4, 0, 1)}, order_puts=[b"ma"]))
    staged = store.stream_commit("v", 5, follows=4)
    staged.row_kv += _rows(0, CHUNK + 1)
    staged.order_puts += [f"m{i}".encode() for i in range(CHUNK + 1)]
    staged.send()
    store.set_lifecycle("v", Lifecycle.LIVE)
    assert staged.finish({0: IndexEntry(5, 0, CHUNK + 1)})
    assert store.mce("v") == 5 and store.row_count("v") == CHUNK + 2
    assert redis_client.zcard(store.key("v", "keyorder")) == CHUNK + 2


def _staged_keys(redis_client: redis.Redis, store: ViewStore) -> list[bytes]:
    return list(redis_client.scan_iter(match=store.key("v", "*.stage.*")))


def _wait_for_staged(redis_client: redis.Redis, store: ViewStore, count: int = 2) -> list[bytes]:
    """The staged keys once ``count`` are there (:meth:`StreamedCommit.send` does not wait for replies)."""
    deadline = time.monotonic() + 10
    while len(keys := _staged_keys(redis_client, store)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return keys


def test_a_view_without_rows_is_staged_and_renamed_into_place(settings: Settings,
                                                             redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.commit("v", EpochCommit(4, {}, [], {0: IndexEntry(4, 0, 0)}))  # an MCE, no rows
    staged = store.stream_commit("v", 5, follows=4)
    count = 2 * CHUNK + 3
    staged.row_kv += _rows(0, count)
    staged.order_puts += [f"m{i}".encode() for i in range(count)]
    staged.send()
    # Written (send does not wait for the replies: give the server a moment), under keys of this epoch
    # alone that expire; readers still see epoch 4 without rows.
    assert len(_wait_for_staged(redis_client, store)) == 2
    assert all(0 < redis_client.ttl(k) <= 3600 for k in _staged_keys(redis_client, store))
    assert store.mce("v") == 4 and store.row_count("v") == 0

    assert staged.finish({0: IndexEntry(5, 3, count)})
    assert store.mce("v") == 5 and store.row_count("v") == count
    assert redis_client.zcard(store.key("v", "keyorder")) == count
    assert redis_client.ttl(store.key("v", "rows")) == -1 and redis_client.ttl(store.key("v", "keyorder")) == -1
    assert _staged_keys(redis_client, store) == []
    assert [e.offset for e in store.index.between("v", 0, 0, 100)] == [0, 3]


def test_staged_keys_that_went_missing_or_rows_that_came_meanwhile_fall_back_to_the_script(
        settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    staged = store.stream_commit("v", 5, follows=0)
    staged.row_kv += _rows(0, CHUNK + 1)
    staged.order_puts += [f"m{i}".encode() for i in range(CHUNK + 1)]
    staged.send()
    redis_client.delete(*_wait_for_staged(redis_client, store))  # expired (or wiped) before the swap
    assert staged.finish({0: IndexEntry(5, 0, CHUNK + 1)})
    assert store.mce("v") == 5 and store.row_count("v") == CHUNK + 1
    assert redis_client.zcard(store.key("v", "keyorder")) == CHUNK + 1

    store.drop("v", 1)
    staged = store.stream_commit("v", 6, follows=0)
    staged.row_kv += _rows(0, 10)
    staged.order_puts += [f"m{i}".encode() for i in range(10)]
    staged.send()
    redis_client.hset(store.key("v", "rows"), b"other", b"1")  # the view got a row meanwhile
    assert staged.finish({0: IndexEntry(6, 0, 10)})
    assert store.mce("v") == 6 and store.row_count("v") == 11  # merged, not replaced
    assert _staged_keys(redis_client, store) == []


def test_an_epoch_committed_meanwhile_is_not_applied_twice(settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    staged = store.stream_commit("v", 5, follows=0)
    staged.row_kv += _rows(0, 10)
    assert store.commit("v", EpochCommit(5, {b"other": b"1"}, [], {0: IndexEntry(5, 0, 1)}, follows=0))
    assert not staged.finish({0: IndexEntry(5, 0, 10)})
    assert store.mce("v") == 5 and store.get_rows("v", [b"k0", b"other"]) == {b"other": b"1"}


def test_a_wiped_store_raises_serving_state_lost(settings: Settings, redis_client: redis.Redis) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.commit("v", EpochCommit(5, {b"a": b"1"}, [], {0: IndexEntry(5, 0, 1)}))
    staged = store.stream_commit("v", 6, follows=5)
    staged.row_kv += _rows(0, 10)
    staged.send()
    redis_client.delete(store.key("v", "meta"), store.key("v", "rows"))  # a wipe of this view's keys
    with pytest.raises(ServingStateLostError):
        staged.finish({0: IndexEntry(6, 1, 10)})
    assert store.mce("v") is None and store.row_count("v") == 0
    # The same for a view without rows (staged): the swap script refuses it.
    assert store.commit("v", EpochCommit(8, {}, [], {0: IndexEntry(8, 0, 0)}))
    staged = store.stream_commit("v", 9, follows=8)
    staged.row_kv += _rows(0, 10)
    redis_client.delete(store.key("v", "meta"))
    with pytest.raises(ServingStateLostError):
        staged.finish({0: IndexEntry(9, 1, 10)})
    assert store.row_count("v") == 0 and _staged_keys(redis_client, store) == []
    store.drop("v", 1)
    # Opened on a MCE other than the one it follows: nothing is queued, the script decides the same.
    staged = store.stream_commit("v", 7, follows=6)
    staged.row_kv += _rows(0, 10)
    with pytest.raises(ServingStateLostError):
        staged.finish({0: IndexEntry(7, 2, 10)})
    assert store.row_count("v") == 0


def _kill_between_kafka_and_redis(settings: Settings, table: str, first: int, count: int) -> int:
    """Run a writer of ``table`` that upserts ``count`` rows from id ``first`` and is SIGKILLed once the
    epoch's Kafka transaction committed and its Redis commands are sent; returns that epoch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-m", "tests.integration.processes.table_killed_before_redis",
                            settings.model_dump_json(), table, str(first), str(count)],
                           capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert child.returncode == -9, child.stderr
    return int(child.stdout.split()[1])


@pytest.mark.parametrize("rows_before", [100, 0], ids=["queued", "staged"])
def test_a_writer_killed_between_kafka_and_redis_is_rolled_forward_by_the_next(
        settings: Settings, redis_client: redis.Redis, rows_before: int) -> None:
    columns = {"id": "int", "v": "string"}
    table = Table.create(settings, "t", columns, ["id"], client=redis_client, auto_commit=False)
    table.upsert([{"id": i, "v": f"row {i}"} for i in range(rows_before)])
    first = table.flush()
    table.close()
    store = table.store

    killed = _kill_between_kafka_and_redis(settings, "t", 100, 2 * CHUNK)
    assert killed > first
    # Kafka has the epoch, Redis does not: queued commands died with the connection, staged keys expire.
    assert store.mce("t") == first and store.row_count("t") == rows_before
    staged = list(redis_client.scan_iter(match=store.key("t", "*.stage.*")))
    assert len(staged) == (2 if rows_before == 0 else 0)
    assert all(0 < redis_client.ttl(k) <= 3600 for k in staged)

    # The epoch is in a committed transaction and the next writer fences the killed one: it is final (a
    # source table's offsets committed with it), so the next writer rolls Redis forward over it and its
    # first barrier names it. Abandoning it would lose a source's messages for good.
    reopened = Table.open(settings, "t", client=redis_client, auto_commit=False)
    assert store.mce("t") == killed
    assert store.row_count("t") == rows_before + 2 * CHUNK
    row_100 = encode_key(("id",), (100,))
    assert decode_row(store.get_rows("t", [row_100])[row_100]) == {"id": 100, "v": "row 100"}
    reopened.upsert([{"id": 0, "v": "changed"}])
    assert reopened.flush() > killed
    rows_after = rows_before + 2 * CHUNK + (1 if rows_before == 0 else 0)
    assert store.row_count("t") == rows_after and redis_client.zcard(store.key("t", "keyorder")) == rows_after
    key = encode_key(("id",), (0,))
    assert decode_row(store.get_rows("t", [key])[key]) == {"id": 0, "v": "changed"}
    reopened.close()
