"""The Nexmark queries the peer engines run: output columns, output key, and the DuckDB oracle of each.

Every engine's job (``jobs/<engine>_job.py``) implements the same queries in its own API or SQL dialect;
this module is what the parent (mvlog's venv) needs to judge them: which columns an output row has, whether
the output is append-only (the final result is the multiset of rows) or updating (the final result is the
last row per key), the DuckDB SQL that computes the final result from the input records independently of
every engine, and which input event an output row stems from (for the latency of the steady phase).

Times are int epoch milliseconds (``date_time``, ``expires``) in the topics and in every output; a query that
formats a date formats it in UTC.

Deviations from the published Nexmark queries, the same in every engine and the oracle:

* q1 keeps ``price`` as the decimal ``0.908 * price`` (compared rounded to 3 decimals: exact).
* q17's ``avg_price`` is the average as a double (Flink's ``AVG(BIGINT)`` would truncate to a BIGINT).
* q21 and q22 follow Spark's (and DuckDB's) functions where engines differ: ``regexp_extract`` and
  ``split_part`` give ``''``, not NULL, when nothing matches, so q21's ``WHERE`` keeps every bid; engines
  whose functions give NULL (Flink) wrap them in ``COALESCE(..., '')``.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The three record kinds: columns and DuckDB types (the generator's model; ints are BIGINT, text VARCHAR).
TABLE_COLUMNS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "person": (("id", "BIGINT"), ("name", "VARCHAR"), ("email_address", "VARCHAR"), ("credit_card", "VARCHAR"),
               ("city", "VARCHAR"), ("state", "VARCHAR"), ("date_time", "BIGINT"), ("extra", "VARCHAR")),
    "auction": (("id", "BIGINT"), ("item_name", "VARCHAR"), ("description", "VARCHAR"), ("initial_bid", "BIGINT"),
                ("reserve", "BIGINT"), ("date_time", "BIGINT"), ("expires", "BIGINT"), ("seller", "BIGINT"),
                ("category", "BIGINT"), ("extra", "VARCHAR")),
    "bid": (("auction", "BIGINT"), ("bidder", "BIGINT"), ("price", "BIGINT"), ("channel", "VARCHAR"),
            ("url", "VARCHAR"), ("date_time", "BIGINT"), ("extra", "VARCHAR")),
}

Record = Mapping[str, Any]
EventKey = Callable[[str, Record], Hashable | None]


@dataclass(frozen=True)
class PeerQuery:
    """One query as the peers run it."""

    name: str
    inputs: tuple[str, ...]  # the tables it reads
    columns: tuple[str, ...]  # output columns, in order
    key: tuple[str, ...] | None  # None: append-only output; else the key of an updating output
    oracle_sql: str  # DuckDB over tables person / auction / bid
    # Latency: the key an input event's effect shows under (None: this event has no output of its own) ...
    event_key: EventKey
    # ... and the same key of an output row.
    output_key: Callable[[Record], Hashable]
    # An updating query's row: how many events of its key it reflects (None: not known from the row).
    covers: Callable[[Record], int] | None = None

    @property
    def updating(self) -> bool:
        return self.key is not None


def _bid_identity(table: str, record: Record) -> Hashable | None:
    return (record["auction"], record["bidder"], record["date_time"]) if table == "bid" else None


def _q2_key(table: str, record: Record) -> Hashable | None:
    if table == "bid" and record["auction"] % 123 == 0:
        return (record["auction"], record["price"])
    return None


def _q3_key(table: str, record: Record) -> Hashable | None:
    # The auction's own produce time: when its seller came first (nearly always), that is when the row is due.
    return record["id"] if table == "auction" and record["category"] == 10 else None


def _q17_key(table: str, record: Record) -> Hashable | None:
    return (record["auction"], record["date_time"] // 86_400_000) if table == "bid" else None


def _q17_output_key(row: Record) -> Hashable:
    year, month, day = (int(part) for part in str(row["day"]).split("-"))
    return (row["auction"], (datetime.date(year, month, day) - datetime.date(1970, 1, 1)).days)


_Q20_COLUMNS = ("auction", "bidder", "price", "channel", "url", "bid_date_time", "bid_extra", "item_name",
                "description", "initial_bid", "reserve", "auction_date_time", "expires", "seller", "category",
                "auction_extra")
_CHANNEL_ID = "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)"


def _bid_price_key(table: str, record: Record) -> Hashable | None:
    return (record["auction"], record["bidder"], record["price"]) if table == "bid" else None


def _q20_key(table: str, record: Record) -> Hashable | None:
    return (record["auction"], record["bidder"], record["date_time"]) if table == "bid" else None


QUERIES: Mapping[str, PeerQuery] = {q.name: q for q in (
    PeerQuery(
        "q0", ("bid",), ("auction", "bidder", "price", "date_time", "extra"), None,
        "SELECT auction, bidder, price, date_time, extra FROM bid",
        _bid_identity, lambda row: (row["auction"], row["bidder"], row["date_time"])),
    PeerQuery(
        "q1", ("bid",), ("auction", "bidder", "price", "date_time", "extra"), None,
        "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid",
        _bid_identity, lambda row: (row["auction"], row["bidder"], row["date_time"])),
    PeerQuery(
        "q2", ("bid",), ("auction", "price"), None,
        "SELECT auction, price FROM bid WHERE auction % 123 = 0",
        _q2_key, lambda row: (row["auction"], row["price"])),
    PeerQuery(
        "q3", ("person", "auction"), ("name", "city", "state", "id"), None,
        "SELECT P.name, P.city, P.state, A.id FROM auction AS A JOIN person AS P ON A.seller = P.id "
        "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
        _q3_key, lambda row: row["id"]),
    PeerQuery(
        "q17", ("bid",),
        ("auction", "day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "min_price", "max_price",
         "avg_price", "sum_price"),
        ("auction", "day"),
        "SELECT auction, strftime(make_timestamp(date_time * 1000), '%Y-%m-%d') AS day, count(*) AS total_bids, "
        "count(*) FILTER (WHERE price < 10000) AS rank1_bids, "
        "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
        "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, min(price) AS min_price, "
        "max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price "
        "FROM bid GROUP BY auction, day",
        _q17_key, _q17_output_key, covers=lambda row: int(row["total_bids"])),
    PeerQuery(
        "q20", ("bid", "auction"), _Q20_COLUMNS, None,
        "SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time, B.extra AS bid_extra, "
        "A.item_name, A.description, A.initial_bid, A.reserve, A.date_time AS auction_date_time, A.expires, "
        "A.seller, A.category, A.extra AS auction_extra FROM bid AS B JOIN auction AS A ON B.auction = A.id "
        "WHERE A.category = 10",
        _q20_key, lambda row: (row["auction"], row["bidder"], row["bid_date_time"])),
    PeerQuery(
        "q21", ("bid",), ("auction", "bidder", "price", "channel", "channel_id"), None,
        "SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
        "WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN '2' "
        f"WHEN lower(channel) = 'baidu' THEN '3' ELSE {_CHANNEL_ID} END AS channel_id FROM bid "
        f"WHERE {_CHANNEL_ID} IS NOT NULL OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')",
        _bid_price_key, lambda row: (row["auction"], row["bidder"], row["price"])),
    PeerQuery(
        "q22", ("bid",), ("auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"), None,
        "SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2, "
        "split_part(url, '/', 6) AS dir3 FROM bid",
        _bid_price_key, lambda row: (row["auction"], row["bidder"], row["price"])),
)}


def peer_query(name: str) -> PeerQuery:
    try:
        return QUERIES[name]
    except KeyError:
        raise ValueError(f"the peers run no query {name!r}; they run {', '.join(QUERIES)}") from None


# ------------------------------------------------------------------------------------------ comparison


def normalize_value(value: Any) -> Any:
    """A value as compared across engines: decimals and doubles rounded to 3 decimals (0.908 * an int is
    exact there; averages differ in their last bits between engines)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float | decimal.Decimal):
        rounded = round(float(value), 3)
        return int(rounded) if rounded.is_integer() else rounded
    return value


def normalize_row(query: PeerQuery, row: Record) -> tuple[Any, ...]:
    """The output row as a tuple of the query's columns, normalized; a missing column is a clear error."""
    try:
        return tuple(normalize_value(row[column]) for column in query.columns)
    except KeyError as missing:
        raise ValueError(f"{query.name}: an output row lacks column {missing}: {dict(row)!r}") from None


def oracle_rows(query: PeerQuery, records: Mapping[str, Sequence[Record]]) -> list[tuple[Any, ...]]:
    """The query's final result computed by DuckDB over ``records`` (table name -> its records): the rows,
    normalized like the engines'."""
    import duckdb
    import pyarrow as pa

    arrow_types = {"BIGINT": pa.int64(), "VARCHAR": pa.string()}
    con = duckdb.connect()
    try:
        for table, columns in TABLE_COLUMNS.items():
            schema = pa.schema([(name, arrow_types[kind]) for name, kind in columns])
            rows = [{name: record.get(name) for name, _ in columns} for record in records.get(table, ())]
            con.register(f"{table}_arrow", pa.Table.from_pylist(rows, schema=schema))
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM {table}_arrow")
        result = con.execute(query.oracle_sql).fetchall()
    finally:
        con.close()
    return [tuple(normalize_value(v) for v in row) for row in result]


def multiset(rows: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
    counts: dict[tuple[Any, ...], int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    return counts
