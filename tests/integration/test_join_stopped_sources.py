"""A join over source tables whose ingesters stop reaches the end of both tables (mvlog.join_bound).

A join's epochs are the union of its upstreams' epochs, planned up to an epoch none of them can still
commit at or below. A running ingester cuts an epoch every interval, so its table never holds a join back
for long; a stopped one cuts none, and before this the join followed its FROM-first table's epochs up to
the other table's last one: with the first table's epochs all after the other's last (an ingester that
caught up and exited before the other started) the join committed nothing, and the other table's epochs
after the first table's last one never reached the view. Now the consumer seals a stopped table through
its bound (mvlog.connectors.redis.table_writers) and plans past that table's last epoch; a writer that
opens again starts above the seal.

The real stack: Kafka topics read by ``SourceIngester`` (``run-source``'s loop, ``until_caught_up``: it
stops as a ``run-source --until-caught-up`` does), the view's Spark consumer streaming throughout, and the
oracle (DuckDB over the tables' rows at every epoch of the view) at the end.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis

from mvlog.config import Settings
from mvlog.connectors.redis.table_writers import TableWriters
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.row_schema import Key
from mvlog.services.pipeline.view_consumer import ViewConsumer
from mvlog.services.sources.declare import create_source_table
from mvlog.services.sources.ingester import SourceIngester
from mvlog.services.view_ddl import create_view
from tests.integration.streaming_query import started
from tests.integration.test_source_tables import SourceTopic, table_rows
from tests.oracle import check_oracle

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(600)]

VIEW_SQL = ("SELECT o.id, o.amount, c.id AS cid, c.name FROM orders AS o JOIN customers AS c "
            "ON o.customer = c.id")


def ingest(settings: Settings, client: redis.Redis, table: str) -> tuple[int, int]:
    """Run ``table``'s ingester until it caught up, then stop it; (first, last) epoch it committed."""
    first: list[int] = []

    class Recording(SourceIngester):
        def epoch_committed(self, epoch: int, positions: Any, messages: int) -> None:
            if not first:
                first.append(epoch)

    with Recording(settings, table, client) as ingester:
        progress = ingester.run(until_caught_up=True)
    assert progress.epochs >= 1 and first and progress.last_epoch is not None, progress
    return first[0], progress.last_epoch


def expected_join(orders: dict[Key, dict[str, Any]], customers: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    by_id = {row["id"]: row for row in customers.values()}
    return {(o["id"],): {"id": o["id"], "amount": o["amount"], "cid": o["customer"],
                         "name": by_id[o["customer"]]["name"]}
            for o in orders.values() if o["customer"] in by_id}


@pytest.mark.parametrize("in_tasks", [False, True], ids=["driver", "tasks"])
def test_a_join_over_stopped_source_tables_reaches_the_end_of_both(make_settings: Any, spark: Any,
                                                                  in_tasks: bool) -> None:
    """``tasks``: the join's operator in Spark's tasks (``Settings.operators_in_tasks``), streamed: each
    micro-batch's other side read up to its latest epoch, the tasks cut it at the stream's end marker."""
    settings: Settings = make_settings(barrier_interval_ms=200, operators_in_tasks=in_tasks, tasks_min_records=0)
    client = redis.Redis.from_url(settings.redis_url)
    rng = random.Random(7)
    orders = SourceTopic(settings, f"{settings.topic_prefix}.orders", partitions=2)
    customers = SourceTopic(settings, f"{settings.topic_prefix}.customers", partitions=2)
    create_source_table(settings, "orders", {"id": "int", "customer": "int", "amount": "int"}, ["id"], orders.name,
                        "upsert-json", client=client)
    create_source_table(settings, "customers", {"id": "int", "name": "string"}, ["id"], customers.name,
                        "upsert-json", client=client)
    create_view(settings, "order_names", VIEW_SQL, client=client)  # FROM-first: orders
    consumer = ViewConsumer(settings, "order_names", spark=spark, client=client)
    assert (consumer.tasks is not None) is in_tasks
    writers = TableWriters(client, settings.topic_prefix)
    try:
        started(consumer.start())

        # Wave 1: customers' ingester runs and stops, then orders': every epoch of the join's first table is
        # above the other's last (before, the join then committed nothing at all).
        for c in range(20):
            customers.send({"id": c}, {"id": c, "name": f"c{c}"}, (c,), {"id": c, "name": f"c{c}"})
        customers.flush()
        _, customers_last = ingest(settings, client, "customers")
        for o in range(150):
            k, customer, amount = o % 90, rng.randrange(25), rng.randrange(1000)  # 5 customers never exist
            if o >= 90 and rng.random() < 0.3:
                orders.send({"id": k}, None, (k,), None)  # deletes, some of keys already gone
            else:
                orders.send({"id": k}, {"id": k, "customer": customer, "amount": amount}, (k,),
                            {"id": k, "customer": customer, "amount": amount})
        orders.flush()
        orders_first, orders_last = ingest(settings, client, "orders")
        assert orders_first > customers_last  # the case that committed nothing
        assert writers.stopped(["orders", "customers"]) == {"orders", "customers"}
        consumer.wait_for_epoch(orders_last, timeout=180)  # the end of both tables
        assert consumer.mce == orders_last
        seal = writers.sealed("customers")
        assert seal >= orders_last  # the consumer planned past customers' last epoch, having sealed it

        # Wave 2: customers' writer opens again (its epochs above the seal) after orders stopped: renamed,
        # added and deleted customers, all after the first table's last epoch (before, they never reached
        # the view: the join waited for an epoch of orders that a stopped ingester never cuts).
        for c in (3, 5, 21, 22, 23):
            customers.send({"id": c}, {"id": c, "name": f"n{c}"}, (c,), {"id": c, "name": f"n{c}"})
        customers.send({"id": 7}, None, (7,), None)
        customers.flush()
        reopened_first, customers_end = ingest(settings, client, "customers")
        assert reopened_first > seal  # the writer that opened took the seal: nothing below it was committed
        consumer.wait_for_epoch(customers_end, timeout=180)
        assert consumer.mce == customers_end
    finally:
        consumer.stop()
    # A view created now reads all of it as a backlog (batch reads, ViewConsumer.start's trigger_ends and
    # _read_first), not through the stream: the same union of epochs, to the same end.
    create_view(settings, "order_names_late", VIEW_SQL, client=client)
    late = ViewConsumer(settings, "order_names_late", spark=spark, client=client)
    try:
        late.start()
        late.wait_for_epoch(customers_end, timeout=180)
    finally:
        late.stop()
    if in_tasks:  # every epoch of both views went through the tasks, every partition written by them
        assert consumer.tasks is not None and late.tasks is not None
        epochs = len(ViewStore(client, settings.topic_prefix).index.between("order_names", 0, 0, customers_end))
        assert consumer.tasks.epochs_written == late.tasks.epochs_written == epochs * consumer.entry.partitions

    store = ViewStore(client, settings.topic_prefix)
    assert store.mce("order_names") == max(store.mce("orders") or 0, store.mce("customers") or 0)
    assert store.mce("order_names_late") == store.mce("order_names")
    columns = ("id", "amount", "cid", "name")
    for name in ("order_names", "order_names_late"):
        view = {k: {c: row[c] for c in columns} for k, row in table_rows(client, settings, name, ("id",)).items()}
        assert view == expected_join(orders.fold(), customers.fold()), name
        assert len(view) > 40  # the workload joins: most orders have their customer
    # Every epoch of the views (the union of both tables' epochs) equals DuckDB over the tables at that epoch.
    assert check_oracle(settings, client, ["orders", "customers", "order_names", "order_names_late"]) >= 6
    client.close()
