"""A Python worker's kept partition writers (``KeptWriters``) on the real broker and redis-server: used
again while their claim is their own, dropped unused once another writer claimed the partition, and, when
fenced without a claim (a worker that died between its ``init_transactions`` and its claim), the work is
started over with a new writer: every epoch is committed once."""

from __future__ import annotations

import pytest
import redis

from mvlog.catalog import CatalogEntry
from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.kafka.partition_tail import partition_barriers
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.writer_claims import WriterClaims
from mvlog.services.pipeline.kept_writers import KeptWriters
from mvlog.services.pipeline.partition_tasks import partition_transactional_id
from mvlog.services.tables.writer import Table


@pytest.fixture
def view(settings: Settings, redis_client: redis.Redis) -> CatalogEntry:
    """A changelog topic to write barriers to (a table's, which writes nothing itself here)."""
    Table.create(settings, "t1", {"id": "int"}, ["id"], client=redis_client).close()
    return CatalogStore(settings, redis_client).get("t1")


def test_a_kept_writer_is_used_again_until_another_claims_or_fences_its_partition(
        settings: Settings, redis_client: redis.Redis, view: CatalogEntry) -> None:
    kept, claims = KeptWriters(outside_tasks=True), WriterClaims(redis_client, settings.topic_prefix)
    tid = partition_transactional_id(settings, view.name, 1)
    used: list[ChangelogWriter] = []

    def commit(epoch: int) -> int:
        def work(writer: ChangelogWriter, was_kept: bool) -> int:
            assert was_kept == any(writer is w for w in used)
            used.append(writer)
            writer.commit_batches(epoch, epoch - 1, [])  # the epoch's barrier on partition 1
            return epoch
        return kept.run(settings, view, 1, tid, claims, work)

    def another_worker(*, claims_it: bool) -> None:
        other = ChangelogWriter(settings, view.name, view.key_columns, view.partitions, transactional_id=tid,
                                partition=1)  # its init_transactions fences the kept writer
        if claims_it:
            claims.claim(view.name, 1, "another worker's writer")
        other.close()

    try:
        assert commit(1) == 1 and commit(2) == 2
        assert used[1] is used[0]  # kept, and still its claim's

        another_worker(claims_it=True)
        assert commit(3) == 3
        assert len(used) == 3 and used[2] is not used[0]  # dropped unused: the claim was another's

        another_worker(claims_it=False)  # fenced, and its claim still says it is the last
        assert commit(4) == 4
        assert len(used) == 5 and used[3] is used[2] and used[4] is not used[2]  # failed, then a new one

        assert commit(5) == 5 and used[5] is used[4]
    finally:
        kept.close()
    barriers = partition_barriers(settings, view.name, 1, 0)
    assert [b.epoch for b in barriers] == [1, 2, 3, 4, 5]  # each once: the fenced attempt committed nothing


def test_at_most_the_setting_is_kept_and_a_failed_writer_never_is(
        settings: Settings, redis_client: redis.Redis, view: CatalogEntry) -> None:
    settings = settings.model_copy(update={"task_writers_kept": 1})
    kept, claims = KeptWriters(outside_tasks=True), WriterClaims(redis_client, settings.topic_prefix)
    used: dict[int, list[ChangelogWriter]] = {0: [], 1: []}

    def commit(partition: int, epoch: int, *, fail: bool = False) -> None:
        def work(writer: ChangelogWriter, was_kept: bool) -> None:
            assert was_kept == any(writer is w for w in used[partition])
            used[partition].append(writer)
            if fail:
                raise ValueError("the operator failed")
            writer.commit_batches(epoch, epoch - 1, [])
        kept.run(settings, view, partition, partition_transactional_id(settings, view.name, partition), claims, work)

    try:
        commit(0, 1)
        commit(1, 1)  # the one kept now: partition 0's writer was closed
        commit(0, 2)
        assert used[0][1] is not used[0][0]
        commit(0, 3)
        assert used[0][2] is used[0][1]
        with pytest.raises(ValueError, match="operator failed"):  # tried with the kept one, then a new one
            commit(0, 4, fail=True)
        assert used[0][3] is used[0][2] and used[0][4] is not used[0][2]
        commit(0, 4)
        assert used[0][5] not in used[0][:5]  # the failed ones were not kept
        assert used[0][0].closed and used[0][2].closed  # evicted and failed writers are closed
        assert not used[0][5].closed  # the one kept is not
    finally:
        kept.close()
    assert [b.epoch for b in partition_barriers(settings, view.name, 0, 0)] == [1, 2, 3, 4]
