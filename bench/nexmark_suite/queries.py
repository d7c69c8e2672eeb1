"""The Nexmark queries q0-q22 as SQL over the tables ``person``, ``auction`` and ``bid`` (see :mod:`.model`).

Written after the reference's Flink SQL (github.com/nexmark/nexmark, ``nexmark-flink/src/main/resources/
queries/q*.sql``), in **Spark SQL** as mvlog's view definitions take it, with the one difference of this
suite's data: times are int epoch **milliseconds** (``date_time``, ``expires``), and a function that takes a
timestamp is given such an int column directly:

* ``window(date_time, '10 seconds'[, '2 seconds'])`` and ``session_window(date_time, '10 seconds')``
  group by event-time windows; ``window.start`` / ``window.end`` are int milliseconds too, so
  ``window.end - 10000`` is ten seconds earlier;
* ``date_format(date_time, 'yyyy-MM-dd')`` and ``hour(date_time)`` read the instant in UTC.

(q7 writes ``GROUP BY (window(...))`` in parentheses: sqlglot, which mvlog parses with, takes a bare
``GROUP BY window(`` for the start of a named-window clause.) A runner for plain Spark (or another engine)
wraps such a column in ``timestamp_millis(...)`` (and takes ``unix_millis(window.start)`` back).

Renamings from the reference: snake_case columns (``date_time``, ``item_name`` ...), Flink's ``MOD(a, b)``
as ``a % b``, ``SPLIT_INDEX(s, '/', i)`` (0-based) as ``split_part(s, '/', i + 1)`` (1-based, in Spark and
DuckDB alike), the ``count_char`` UDF of q14 as ``length(s) - length(replace(s, 'c', ''))``, and window
TVFs (``TABLE(HOP(...))``) as Spark's ``window`` grouping; the results are the same.

q12 groups by processing time (``current_timestamp()``): no deterministic result, kept for completeness.
q13 joins a ``side_input(key, value)`` table the suite does not generate (the reference's file:
``key = value = 0..9999``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_RANKS = """count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids"""
_DISTINCT_RANKS = """count(DISTINCT bidder) AS total_bidders,
       count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
       count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
       count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
       count(DISTINCT auction) AS total_auctions,
       count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
       count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
       count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""


@dataclass(frozen=True)
class NexmarkQuery:
    """One query: its id, what it computes, its SQL, the tables it reads."""

    id: str  # "q0" .. "q22"
    title: str
    sql: str
    tables: tuple[str, ...]  # of person / auction / bid (and side_input for q13)
    deterministic: bool = True  # False: the result depends on processing time (q12)


def _q(id: str, title: str, tables: tuple[str, ...], sql: str, deterministic: bool = True) -> NexmarkQuery:
    return NexmarkQuery(id, title, " ".join(line.strip() for line in sql.strip().splitlines()), tables,
                        deterministic)


QUERY_LIST: tuple[NexmarkQuery, ...] = (
    _q("q0", "pass-through", ("bid",), "SELECT auction, bidder, price, date_time, extra FROM bid"),
    _q("q1", "currency conversion", ("bid",), """
        SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"""),
    _q("q2", "selection", ("bid",), "SELECT auction, price FROM bid WHERE auction % 123 = 0"),
    _q("q3", "local item suggestion", ("auction", "person"), """
        SELECT P.name, P.city, P.state, A.id
        FROM auction AS A JOIN person AS P ON A.seller = P.id
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"""),
    _q("q4", "average price for a category", ("auction", "bid"), """
        SELECT Q.category, avg(Q.final) AS avg_final
        FROM (SELECT max(B.price) AS final, A.category
              FROM auction AS A JOIN bid AS B ON A.id = B.auction
              WHERE B.date_time BETWEEN A.date_time AND A.expires
              GROUP BY A.id, A.category) AS Q
        GROUP BY Q.category"""),
    _q("q5", "hot items", ("bid",), """
        SELECT AuctionBids.auction, AuctionBids.num
        FROM (SELECT auction, count(*) AS num, window.start AS starttime, window.end AS endtime
              FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) AS AuctionBids
        JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
              FROM (SELECT count(*) AS num, window.start AS starttime, window.end AS endtime
                    FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) AS CountBids
              GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
        ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
           AND AuctionBids.num >= MaxBids.maxn"""),
    _q("q6", "average selling price by seller", ("auction", "bid"), """
        SELECT Q.seller,
               avg(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.date_time
                                  ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
        FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY T.id, T.seller ORDER BY T.price DESC) AS rownum
              FROM (SELECT A.id, A.seller, B.price, B.date_time
                    FROM auction AS A JOIN bid AS B ON A.id = B.auction
                    WHERE B.date_time BETWEEN A.date_time AND A.expires) AS T) AS Q
        WHERE Q.rownum <= 1"""),
    _q("q7", "highest bid", ("bid",), """
        SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
        FROM bid AS B
        JOIN (SELECT max(price) AS maxprice, window.end AS date_time
              FROM bid GROUP BY (window(date_time, '10 seconds'))) AS B1
        ON B.price = B1.maxprice
        WHERE B.date_time BETWEEN B1.date_time - 10000 AND B1.date_time"""),
    _q("q8", "monitor new users", ("person", "auction"), """
        SELECT P.id, P.name, P.starttime
        FROM (SELECT id, name, window.start AS starttime, window.end AS endtime
              FROM person GROUP BY id, name, window(date_time, '10 seconds')) AS P
        JOIN (SELECT seller, window.start AS starttime, window.end AS endtime
              FROM auction GROUP BY seller, window(date_time, '10 seconds')) AS A
        ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"""),
    _q("q9", "winning bids", ("auction", "bid"), """
        SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra,
               auction, bidder, price, bid_date_time, bid_extra
        FROM (SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,
                     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
              FROM auction AS A JOIN bid AS B ON A.id = B.auction
              WHERE B.date_time BETWEEN A.date_time AND A.expires) AS T
        WHERE rownum <= 1"""),
    _q("q10", "log to file system (the partition columns)", ("bid",), """
        SELECT auction, bidder, price, date_time, extra,
               date_format(date_time, 'yyyy-MM-dd') AS dt, date_format(date_time, 'HH:mm') AS hm
        FROM bid"""),
    _q("q11", "user sessions", ("bid",), """
        SELECT bidder, count(*) AS bid_count, session_window.start AS starttime, session_window.end AS endtime
        FROM bid GROUP BY bidder, session_window(date_time, '10 seconds')"""),
    _q("q12", "processing-time windows", ("bid",), """
        SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS endtime
        FROM bid GROUP BY bidder, window(current_timestamp(), '10 seconds')""", deterministic=False),
    _q("q13", "bounded side input join", ("bid", "side_input"), """
        SELECT B.auction, B.bidder, B.price, B.date_time, S.value
        FROM bid AS B JOIN side_input AS S ON B.auction % 10000 = S.key"""),
    _q("q14", "calculation", ("bid",), """
        SELECT auction, bidder, 0.908 * price AS price,
               CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
                    WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
                    ELSE 'otherTime' END AS bid_time_type,
               date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
        FROM bid
        WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"""),
    _q("q15", "bidding statistics report", ("bid",), f"""
        SELECT date_format(date_time, 'yyyy-MM-dd') AS day,
               count(*) AS total_bids,
               {_RANKS},
               {_DISTINCT_RANKS}
        FROM bid GROUP BY date_format(date_time, 'yyyy-MM-dd')"""),
    _q("q16", "channel statistics report", ("bid",), f"""
        SELECT channel, date_format(date_time, 'yyyy-MM-dd') AS day,
               max(date_format(date_time, 'HH:mm')) AS minute,
               count(*) AS total_bids,
               {_RANKS},
               {_DISTINCT_RANKS}
        FROM bid GROUP BY channel, date_format(date_time, 'yyyy-MM-dd')"""),
    _q("q17", "auction statistics report", ("bid",), f"""
        SELECT auction, date_format(date_time, 'yyyy-MM-dd') AS day,
               count(*) AS total_bids,
               {_RANKS},
               min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price
        FROM bid GROUP BY auction, date_format(date_time, 'yyyy-MM-dd')"""),
    _q("q18", "find last bid", ("bid",), """
        SELECT auction, bidder, price, channel, url, date_time, extra
        FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
              FROM bid) AS T
        WHERE rank_number <= 1"""),
    _q("q19", "auction top-10 price", ("bid",), """
        SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
                       FROM bid) AS T
        WHERE rank_number <= 10"""),
    _q("q20", "expand bid with auction", ("bid", "auction"), """
        SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time, B.extra AS bid_extra,
               A.item_name, A.description, A.initial_bid, A.reserve, A.date_time AS auction_date_time, A.expires,
               A.seller, A.category, A.extra AS auction_extra
        FROM bid AS B JOIN auction AS A ON B.auction = A.id
        WHERE A.category = 10"""),
    _q("q21", "add channel id", ("bid",), """
        SELECT auction, bidder, price, channel,
               CASE WHEN lower(channel) = 'apple' THEN '0'
                    WHEN lower(channel) = 'google' THEN '1'
                    WHEN lower(channel) = 'facebook' THEN '2'
                    WHEN lower(channel) = 'baidu' THEN '3'
                    ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
        FROM bid
        WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL
              OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')"""),
    _q("q22", "get URL directories", ("bid",), """
        SELECT auction, bidder, price, channel,
               split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3
        FROM bid"""),
)

QUERIES: Mapping[str, NexmarkQuery] = {q.id: q for q in QUERY_LIST}


def query_ids(spec: str) -> list[str]:
    """``"q0,q3"``, ``"q0-q5"``, ``"all"`` -> query ids in order; an unknown one is named."""
    if spec.strip().lower() == "all":
        return [q.id for q in QUERY_LIST]
    order = [q.id for q in QUERY_LIST]
    out: list[str] = []
    for part in (p.strip().lower() for p in spec.split(",") if p.strip()):
        if "-" in part:
            first, last = (p.strip() for p in part.split("-", 1))
            if first not in QUERIES or last not in QUERIES:
                raise ValueError(f"unknown query in range {part!r}; the queries are q0 .. q22")
            out.extend(order[order.index(first):order.index(last) + 1])
        elif part in QUERIES:
            out.append(part)
        else:
            raise ValueError(f"unknown query {part!r}; the queries are q0 .. q22 (or 'all')")
    return list(dict.fromkeys(out))
