"""The Nexmark queries on Quix Streams (run in the Quix peer's venv by ``peers/quix.py``).

Exactly-once as Quix's documentation describes it: ``processing_guarantee="exactly-once"`` (Kafka
transactions: the output, the state changelogs and the consumed offsets commit together), committed every
``commit_interval`` = 1 s (default 5 s; 1 s as Flink's checkpoint interval here). Parallelism: Quix scales
by running more processes of one application in one consumer group, so ``--parallelism`` processes run
(useful only when the input topics have that many partitions). State (RocksDB) under ``--workdir``.

* q0-q2: ``apply`` / ``filter`` on the bid stream.
* q3: both inputs re-keyed by the person id (``group_by``: repartition topics), merged (``concat``: Quix
  aligns the two by timestamp), and an incremental inner join in one stateful ``apply``: each key keeps its
  person (or that it does not qualify) and the auctions that came before it.
* q17: bids re-keyed by (auction, day), one stateful ``apply`` keeps the aggregates and emits the new row
  (an upsert keyed by auction and day).
* q20: as q3, bids and auctions keyed by the auction id. q21, q22: ``apply`` (``nexmark_py``).
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_args
import nexmark_py


def build(app: Any, args: Any) -> None:
    topics = job_args.topics(args)
    query = args.query
    out = app.topic(args.output, value_serializer="json", key_serializer="json")
    if query in ("q0", "q1", "q2", "q17", "q21", "q22"):
        bids = app.dataframe(app.topic(topics["bid"], value_deserializer="json", key_deserializer="json"))
        if query == "q0":
            sdf = bids.apply(lambda v: {"auction": v["auction"], "bidder": v["bidder"], "price": v["price"],
                                        "date_time": v["date_time"], "extra": v["extra"]})
        elif query == "q1":
            sdf = bids.apply(lambda v: {"auction": v["auction"], "bidder": v["bidder"], "price": 0.908 * v["price"],
                                        "date_time": v["date_time"], "extra": v["extra"]})
        elif query == "q2":
            sdf = bids.filter(lambda v: v["auction"] % 123 == 0).apply(
                lambda v: {"auction": v["auction"], "price": v["price"]})
        elif query == "q21":  # the WHERE keeps every bid (regexp_extract gives '' at worst, never NULL)
            sdf = bids.apply(lambda v: {"auction": v["auction"], "bidder": v["bidder"], "price": v["price"],
                                        "channel": v["channel"], "channel_id": nexmark_py.channel_id(v["channel"],
                                                                                                    v["url"])})
        elif query == "q22":
            sdf = bids.apply(lambda v: {"auction": v["auction"], "bidder": v["bidder"], "price": v["price"],
                                        "channel": v["channel"], "dir1": nexmark_py.split_part(v["url"], "/", 4),
                                        "dir2": nexmark_py.split_part(v["url"], "/", 5),
                                        "dir3": nexmark_py.split_part(v["url"], "/", 6)})
        else:
            sdf = bids.group_by(lambda v: [v["auction"], nexmark_py.day(v["date_time"])], name="q17_auction_day")
            sdf = sdf.apply(_q17, stateful=True)
            sdf.to_topic(out, key=lambda row: {"auction": row["auction"], "day": row["day"]})
            return
        sdf.to_topic(out)
        return
    if query == "q3":
        persons = app.dataframe(app.topic(topics["person"], value_deserializer="json", key_deserializer="json"))
        auctions = app.dataframe(app.topic(topics["auction"], value_deserializer="json", key_deserializer="json"))
        persons = persons.group_by(lambda v: v["id"], name="q3_person_id").apply(lambda v: {"p": v})
        auctions = (auctions.filter(lambda v: v["category"] == 10)
                    .group_by(lambda v: v["seller"], name="q3_auction_seller").apply(lambda v: {"a": v}))
        joined = persons.concat(auctions).apply(_q3, stateful=True, expand=True)
        joined.to_topic(out)
        return
    if query == "q20":
        bids = app.dataframe(app.topic(topics["bid"], value_deserializer="json", key_deserializer="json"))
        auctions = app.dataframe(app.topic(topics["auction"], value_deserializer="json", key_deserializer="json"))
        bids = bids.group_by(lambda v: v["auction"], name="q20_bid_auction").apply(lambda v: {"b": v})
        auctions = auctions.group_by(lambda v: v["id"], name="q20_auction_id").apply(lambda v: {"a": v})
        bids.concat(auctions).apply(_q20, stateful=True, expand=True).to_topic(out)
        return
    raise SystemExit(f"quix_job: no query {query!r}")


def _q20(value: dict[str, Any], state: Any) -> list[dict[str, Any]]:
    if "a" in value:
        auction = value["a"]
        qualifies = auction["category"] == 10
        state.set("auction", auction if qualifies else False)
        waiting = state.get("bids", [])
        state.delete("bids")
        return [nexmark_py.q20_row(bid, auction) for bid in waiting] if qualifies else []
    bid = value["b"]
    auction = state.get("auction", None)
    if auction is None:  # the auction is not known yet: keep the bid until it is
        state.set("bids", [*state.get("bids", []), bid])
        return []
    return [nexmark_py.q20_row(bid, auction)] if auction else []


def _q3(value: dict[str, Any], state: Any) -> list[dict[str, Any]]:
    def row(person: dict[str, Any], auction_id: int) -> dict[str, Any]:
        return {"name": person["name"], "city": person["city"], "state": person["state"], "id": auction_id}

    if "p" in value:
        person = value["p"]
        qualifies = person["state"] in ("OR", "ID", "CA")
        state.set("person", person if qualifies else False)
        waiting = state.get("auctions", [])
        state.delete("auctions")
        return [row(person, auction_id) for auction_id in waiting] if qualifies else []
    auction = value["a"]
    person = state.get("person", None)
    if person is None:  # the seller is not known yet: keep the auction until it is
        state.set("auctions", [*state.get("auctions", []), auction["id"]])
        return []
    return [row(person, auction["id"])] if person else []


def _q17(bid: dict[str, Any], state: Any) -> dict[str, Any]:
    price = bid["price"]
    agg = state.get("agg", None) or {"total": 0, "r1": 0, "r2": 0, "r3": 0, "min": price, "max": price, "sum": 0}
    agg["total"] += 1
    agg["r1" if price < 10_000 else "r2" if price < 1_000_000 else "r3"] += 1
    agg["min"], agg["max"], agg["sum"] = min(agg["min"], price), max(agg["max"], price), agg["sum"] + price
    state.set("agg", agg)
    return {"auction": bid["auction"], "day": nexmark_py.day(bid["date_time"]), "total_bids": agg["total"],
            "rank1_bids": agg["r1"], "rank2_bids": agg["r2"], "rank3_bids": agg["r3"], "min_price": agg["min"],
            "max_price": agg["max"], "avg_price": agg["sum"] / agg["total"], "sum_price": agg["sum"]}


def run_one(argv: list[str], index: int) -> None:
    from quixstreams import Application

    args = job_args.parse(argv)
    app = Application(broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", commit_interval=1.0, loglevel="WARNING",
                      state_dir=str(Path(args.workdir) / f"state-{index}"))
    build(app, args)
    app.run()


def main(argv: list[str]) -> int:
    args = job_args.parse(argv)
    import quixstreams  # noqa: F401  (the engine is importable before the clock starts)

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=run_one, args=(argv, i), daemon=True) for i in range(args.parallelism)]
    job_args.ready()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return max((worker.exitcode or 0) for worker in workers)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
