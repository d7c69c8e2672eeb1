"""The Nexmark queries on Spark Structured Streaming (run in the Spark peer's venv by ``peers/spark.py``).

Spark's own Kafka source and sink (``spark-sql-kafka-0-10`` of this pyspark's exact version, ``--jars``),
``local[<parallelism>]`` with as many shuffle partitions, the default trigger (the next micro-batch as soon
as the last one ends), a checkpoint location under ``--workdir``. Guarantee, as Spark's documentation
states it: the source is replayable and the state is checkpointed (exactly-once processing), but the
Kafka sink is at-least-once (a micro-batch retried after a failure may write its rows again), so the
end-to-end guarantee is at-least-once.

The queries are Spark SQL over temporary views of the three streams (times stay int epoch ms):

* q0-q2: projections and filters, append mode.
* q3: a stream-stream inner join without watermark (append mode; Spark keeps both sides' state).
* q17: a streaming aggregation in update mode, its rows written as upserts keyed by (auction, day).
* q20: a stream-stream inner join like q3's; q21, q22: scalar functions (``regexp_extract``, ``split_part``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_args

SCHEMAS = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING, "
              "date_time BIGINT, extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
               "date_time BIGINT, expires BIGINT, seller BIGINT, category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time BIGINT, extra STRING",
}

QUERIES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "q0": ("SELECT auction, bidder, price, date_time, extra FROM bid", None),
    "q1": ("SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid", None),
    "q2": ("SELECT auction, price FROM bid WHERE auction % 123 = 0", None),
    "q3": ("SELECT P.name, P.city, P.state, A.id FROM auction AS A JOIN person AS P ON A.seller = P.id "
           "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')", None),
    "q17": ("SELECT auction, date_format(timestamp_millis(date_time), 'yyyy-MM-dd') AS day, count(*) AS total_bids, "
            "count_if(price < 10000) AS rank1_bids, count_if(price >= 10000 AND price < 1000000) AS rank2_bids, "
            "count_if(price >= 1000000) AS rank3_bids, min(price) AS min_price, max(price) AS max_price, "
            "avg(price) AS avg_price, sum(price) AS sum_price FROM bid GROUP BY auction, "
            "date_format(timestamp_millis(date_time), 'yyyy-MM-dd')", ("auction", "day")),
    "q20": ("SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time, "
            "B.extra AS bid_extra, A.item_name, A.description, A.initial_bid, A.reserve, "
            "A.date_time AS auction_date_time, A.expires, A.seller, A.category, A.extra AS auction_extra "
            "FROM bid AS B JOIN auction AS A ON B.auction = A.id WHERE A.category = 10", None),
    "q21": ("SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
            "WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN '2' "
            "WHEN lower(channel) = 'baidu' THEN '3' ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END "
            "AS channel_id FROM bid WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL "
            "OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')", None),
    "q22": ("SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2, "
            "split_part(url, '/', 6) AS dir3 FROM bid", None),
}
TABLES = {"q0": ("bid",), "q1": ("bid",), "q2": ("bid",), "q3": ("person", "auction"), "q17": ("bid",),
          "q20": ("bid", "auction"), "q21": ("bid",), "q22": ("bid",)}


def main(argv: list[str]) -> int:
    args = job_args.parse(argv, jars="comma-separated jar paths (spark.jars)")
    if args.query not in QUERIES:
        raise SystemExit(f"spark_job: no query {args.query!r}")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as sf

    work = Path(args.workdir)
    spark = (SparkSession.builder.master(f"local[{args.parallelism}]").appName(f"nexmark-{args.query}")
             .config("spark.jars", args.jars)
             .config("spark.sql.shuffle.partitions", str(args.parallelism))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.local.dir", str(work / "spark-local"))
             .config("spark.sql.streaming.checkpointLocation", str(work / "checkpoints"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    topics = job_args.topics(args)
    sql, key = QUERIES[args.query]
    for table in TABLES[args.query]:
        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
               .option("subscribe", topics[table]).option("startingOffsets", "earliest")
               .option("failOnDataLoss", "false").load())
        (raw.select(sf.from_json(sf.col("value").cast("string"), SCHEMAS[table]).alias("r")).select("r.*")
         .createOrReplaceTempView(table))
    result = spark.sql(sql)
    columns = [sf.col(c) for c in result.columns]
    out = result.select(sf.to_json(sf.struct(*columns)).alias("value"))
    if key is not None:
        out = result.select(sf.to_json(sf.struct(*[sf.col(c) for c in key])).alias("key"),
                            sf.to_json(sf.struct(*columns)).alias("value"))
    writer = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
              .option("topic", args.output).option("checkpointLocation", str(work / "checkpoint"))
              .outputMode("update" if key is not None else "append"))
    job_args.ready()
    writer.start().awaitTermination()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
