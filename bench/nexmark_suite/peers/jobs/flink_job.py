"""The Nexmark queries on Flink SQL (run in the Flink peer's venv by ``peers/flink.py``).

PyFlink's Table API in streaming mode on a local mini-cluster (one JVM, ``parallelism.default`` =
``--parallelism``), the Kafka SQL connector (``flink-sql-connector-kafka`` built for this Flink release,
``--jars``, added with ``pipeline.jars``). Exactly-once as Flink's documentation describes it:
checkpointing in ``EXACTLY_ONCE`` mode every second (checkpoints on local disk under ``--workdir``) and a
Kafka sink with ``sink.delivery-guarantee`` = ``exactly-once`` (Kafka transactions committed when a
checkpoint completes; ``transaction.timeout.ms`` 10 minutes, under the broker's 15-minute maximum), sources
reading ``read_committed``. Output is visible to a ``read_committed`` consumer only at checkpoints.

Every query is pure SQL (no Python UDF, so no Python worker): q0-q3 and q20-q22 append to a ``kafka``
table; q17 (an updating aggregation) upserts to an ``upsert-kafka`` table keyed by (auction, day).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_args

COLUMNS = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING, "
              "date_time BIGINT, extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
               "date_time BIGINT, expires BIGINT, seller BIGINT, category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time BIGINT, extra STRING",
}

# query -> (output columns DDL, primary key or None, SELECT)
QUERIES: dict[str, tuple[str, str | None, str]] = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, date_time BIGINT, extra STRING", None,
           "SELECT auction, bidder, price, date_time, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time BIGINT, extra STRING", None,
           "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT", None, "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name STRING, city STRING, state STRING, id BIGINT", None,
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P ON A.seller = P.id "
           "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"),
    "q17": ("auction BIGINT, `day` STRING, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, "
            "rank3_bids BIGINT, min_price BIGINT, max_price BIGINT, avg_price DOUBLE, sum_price BIGINT",
            "auction, `day`",
            "SELECT auction, DATE_FORMAT(TO_TIMESTAMP_LTZ(date_time, 3), 'yyyy-MM-dd') AS `day`, "
            "COUNT(*) AS total_bids, COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, "
            "COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
            "COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, MIN(price) AS min_price, "
            "MAX(price) AS max_price, AVG(CAST(price AS DOUBLE)) AS avg_price, SUM(price) AS sum_price "
            "FROM bid GROUP BY auction, DATE_FORMAT(TO_TIMESTAMP_LTZ(date_time, 3), 'yyyy-MM-dd')"),
    "q20": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, bid_date_time BIGINT, "
            "bid_extra STRING, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
            "auction_date_time BIGINT, expires BIGINT, seller BIGINT, category BIGINT, auction_extra STRING", None,
            "SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time, "
            "B.extra AS bid_extra, A.item_name, A.description, A.initial_bid, A.reserve, "
            "A.date_time AS auction_date_time, A.expires, A.seller, A.category, A.extra AS auction_extra "
            "FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id WHERE A.category = 10"),
    # REGEXP_EXTRACT and SPLIT_INDEX give NULL where Spark's functions give '' (see peers/queries.py).
    "q21": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, channel_id STRING", None,
            "SELECT auction, bidder, price, channel, CASE WHEN LOWER(channel) = 'apple' THEN '0' "
            "WHEN LOWER(channel) = 'google' THEN '1' WHEN LOWER(channel) = 'facebook' THEN '2' "
            "WHEN LOWER(channel) = 'baidu' THEN '3' "
            "ELSE COALESCE(REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2), '') END AS channel_id FROM bid "
            "WHERE COALESCE(REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2), '') IS NOT NULL "
            "OR LOWER(channel) IN ('apple', 'google', 'facebook', 'baidu')"),
    "q22": ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, dir1 STRING, dir2 STRING, dir3 STRING", None,
            "SELECT auction, bidder, price, channel, COALESCE(SPLIT_INDEX(url, '/', 3), '') AS dir1, "
            "COALESCE(SPLIT_INDEX(url, '/', 4), '') AS dir2, COALESCE(SPLIT_INDEX(url, '/', 5), '') AS dir3 FROM bid"),
}
TABLES = {"q0": ("bid",), "q1": ("bid",), "q2": ("bid",), "q3": ("person", "auction"), "q17": ("bid",),
          "q20": ("bid", "auction"), "q21": ("bid",), "q22": ("bid",)}


def main(argv: list[str]) -> int:
    args = job_args.parse(argv, jars="comma-separated jar paths (pipeline.jars)")
    if args.query not in QUERIES:
        raise SystemExit(f"flink_job: no query {args.query!r}")
    from pyflink.table import EnvironmentSettings, TableEnvironment

    work = Path(args.workdir)
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = t_env.get_config()
    for option, value in {
        "pipeline.jars": ";".join(Path(jar).as_uri() for jar in args.jars.split(",") if jar),
        "parallelism.default": str(args.parallelism),
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": (work / "checkpoints").as_uri(),
        "table.local-time-zone": "UTC",
        "rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1", "rest.bind-port": "0",
        "jobmanager.bind-host": "127.0.0.1", "taskmanager.bind-host": "127.0.0.1", "taskmanager.host": "127.0.0.1",
    }.items():
        config.set(option, value)
    topics = job_args.topics(args)
    for table in TABLES[args.query]:
        t_env.execute_sql(
            f"CREATE TABLE {table} ({COLUMNS[table]}) WITH ('connector' = 'kafka', 'topic' = '{topics[table]}', "
            f"'properties.bootstrap.servers' = '{args.bootstrap}', 'properties.group.id' = '{args.group}', "
            "'properties.isolation.level' = 'read_committed', 'scan.startup.mode' = 'earliest-offset', "
            "'format' = 'json')")
    columns, key, select = QUERIES[args.query]
    sink = (f"'topic' = '{args.output}', 'properties.bootstrap.servers' = '{args.bootstrap}', "
            "'sink.delivery-guarantee' = 'exactly-once', "
            f"'sink.transactional-id-prefix' = '{args.group}', 'properties.transaction.timeout.ms' = '600000'")
    if key is None:
        t_env.execute_sql(f"CREATE TABLE nexmark_out ({columns}) WITH ('connector' = 'kafka', {sink}, "
                          "'format' = 'json')")
    else:
        t_env.execute_sql(f"CREATE TABLE nexmark_out ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ("
                          f"'connector' = 'upsert-kafka', {sink}, 'key.format' = 'json', 'value.format' = 'json')")
    job_args.ready()
    t_env.execute_sql(f"INSERT INTO nexmark_out {select}").wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
