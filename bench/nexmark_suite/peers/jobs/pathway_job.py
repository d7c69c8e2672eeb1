"""The Nexmark queries on Pathway (run in the Pathway peer's venv by ``peers/pathway.py``).

Pathway's Kafka reader (JSON, a schema per record kind, ``autocommit_duration_ms`` 100: how often read
records enter the computation) and Kafka writer (JSON rows with Pathway's ``time`` and ``diff`` fields: an
updated row is a retraction, ``diff`` -1, and an insertion). ``PATHWAY_THREADS`` = ``--parallelism``
worker threads (set by the parent). No persistence: Pathway's free edition documents "at least once"
consistency (its enterprise edition "exactly once"); without persistence a restart recomputes from the
topics' start, so the run is at-least-once.

q0-q3, q17 and q20 are Pathway's own operators (``select``, ``filter``, ``join``, ``groupby().reduce``);
q21 and q22 call Python functions (``pw.apply``, ``nexmark_py``) for Spark's ``regexp_extract`` and
``split_part``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_args
import nexmark_py


def main(argv: list[str]) -> int:
    args = job_args.parse(argv)
    import pathway as pw

    # `id` is the name of Pathway's own row-key column: the records' id is read as person_id / auction_id.
    class Person(pw.Schema):  # type: ignore[misc]
        person_id: int
        name: str
        email_address: str
        credit_card: str
        city: str
        state: str
        date_time: int
        extra: str

    class Auction(pw.Schema):  # type: ignore[misc]
        auction_id: int
        item_name: str
        description: str
        initial_bid: int
        reserve: int
        date_time: int
        expires: int
        seller: int
        category: int
        extra: str

    class Bid(pw.Schema):  # type: ignore[misc]
        auction: int
        bidder: int
        price: int
        channel: str
        url: str
        date_time: int
        extra: str

    topics = job_args.topics(args)
    settings = {"bootstrap.servers": args.bootstrap, "group.id": args.group, "auto.offset.reset": "earliest",
                "session.timeout.ms": "6000"}

    def read(table: str, schema: type) -> pw.Table:
        paths = {f"{table}_id": "/id"} if table in ("person", "auction") else None
        return pw.io.kafka.read(settings, topic=topics[table], format="json", schema=schema,
                                autocommit_duration_ms=100, json_field_paths=paths, name=f"{table}_in")

    t = pw.this
    if args.query in ("q0", "q1"):
        bid = read("bid", Bid)
        price = t.price if args.query == "q0" else t.price * 0.908
        out = bid.select(t.auction, t.bidder, price=price, date_time=t.date_time, extra=t.extra)
    elif args.query == "q2":
        out = read("bid", Bid).filter(t.auction % 123 == 0).select(t.auction, t.price)
    elif args.query == "q3":
        auction = read("auction", Auction).filter(t.category == 10)
        person = read("person", Person).filter((t.state == "OR") | (t.state == "ID") | (t.state == "CA"))
        out = auction.join(person, auction.seller == person.person_id).select(
            name=person.name, city=person.city, state=person.state, auction_id=auction.auction_id)
    elif args.query == "q17":
        bid = read("bid", Bid).with_columns(day=t.date_time.dt.utc_from_timestamp(unit="ms").dt.strftime("%Y-%m-%d"))
        out = bid.groupby(t.auction, t.day).reduce(
            t.auction, t.day, total_bids=pw.reducers.count(),
            rank1_bids=pw.reducers.sum(pw.if_else(t.price < 10_000, 1, 0)),
            rank2_bids=pw.reducers.sum(pw.if_else((t.price >= 10_000) & (t.price < 1_000_000), 1, 0)),
            rank3_bids=pw.reducers.sum(pw.if_else(t.price >= 1_000_000, 1, 0)),
            min_price=pw.reducers.min(t.price), max_price=pw.reducers.max(t.price),
            avg_price=pw.reducers.avg(t.price), sum_price=pw.reducers.sum(t.price))
    elif args.query == "q20":
        bid = read("bid", Bid)
        auction = read("auction", Auction).filter(t.category == 10)
        out = bid.join(auction, bid.auction == auction.auction_id).select(
            bid.auction, bid.bidder, bid.price, bid.channel, bid.url, bid_date_time=bid.date_time,
            bid_extra=bid.extra, item_name=auction.item_name, description=auction.description,
            initial_bid=auction.initial_bid, reserve=auction.reserve, auction_date_time=auction.date_time,
            expires=auction.expires, seller=auction.seller, category=auction.category, auction_extra=auction.extra)
    elif args.query == "q21":  # the WHERE keeps every bid (regexp_extract gives '' at worst, never NULL)
        out = read("bid", Bid).select(t.auction, t.bidder, t.price, t.channel,
                                      channel_id=pw.apply(nexmark_py.channel_id, t.channel, t.url))
    elif args.query == "q22":
        out = read("bid", Bid).select(t.auction, t.bidder, t.price, t.channel,
                                      dir1=pw.apply(nexmark_py.split_part, t.url, "/", 4),
                                      dir2=pw.apply(nexmark_py.split_part, t.url, "/", 5),
                                      dir3=pw.apply(nexmark_py.split_part, t.url, "/", 6))
    else:
        raise SystemExit(f"pathway_job: no query {args.query!r}")
    pw.io.kafka.write(out, {"bootstrap.servers": args.bootstrap}, topic_name=args.output, format="json",
                      name="out")
    job_args.ready()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
