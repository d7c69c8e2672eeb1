"""A view consumer never computes an upstream epoch that the upstream's epoch index no longer has.

After a Redis wipe, the rebuild abandons a changelog's last epoch when nothing proves it committed; a
micro-batch planned before the wipe may still hold it. The soak once ended with a view holding such an
epoch (rows lost and doubled against the oracle): the consumer now refuses it and plans again.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.epoch_index import epoch_hex
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.services.pipeline.reading import UpstreamEpochLostError
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.tables.writer import Table
from mvlog.services.view_ddl import create_view

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_an_epoch_gone_from_the_upstream_index_is_refused(settings: Settings, redis_client: redis.Redis,
                                                                      spark: Any) -> None:
    store = ViewStore(redis_client, settings.topic_prefix)
    table = Table.create(settings, "t1", {"id": "int", "v1": "int", "deleted": "boolean"}, ["id"],
                         client=redis_client, auto_commit=False)
    create_view(settings, "mv1", "SELECT * FROM t1 WHERE deleted = false", client=redis_client)
    consumer = ViewConsumer(settings, "mv1", spark=spark, client=redis_client)
    try:
        table.upsert([{"id": i, "v1": i, "deleted": False} for i in range(20)])
        table.flush()
        before = consumer.catch_up()
        table.upsert([{"id": i, "v1": -i, "deleted": False} for i in range(5)])
        lost = table.flush()
        planned = consumer.reader.read_range("t1", before, lost)  # what a micro-batch planned before held
        for partition in range(settings.partitions):  # as a rebuild that abandoned the epoch leaves the index
            key = store.index.key("t1", partition)
            members: list[bytes] = list(redis_client.zrange(key, 0, -1))  # type: ignore[arg-type]
            assert redis_client.zrem(key, *[m for m in members if m.startswith(epoch_hex(lost).encode())]) == 1
        with pytest.raises(UpstreamEpochLostError, match=f"epoch {lost} is no longer in the epoch index"):
            consumer.apply_batch(planned)
        assert store.mce("mv1") == before  # nothing of that epoch reached the view
    finally:
        consumer.stop()
        table.close()
