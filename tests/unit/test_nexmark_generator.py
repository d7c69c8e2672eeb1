"""The Nexmark generator (bench/nexmark_suite/generator.py) follows the reference generator's rules.

Each rule is checked on its own over generated streams of random seeds and lengths: the 1/3/46 mix by
position, ids in order from 1000, sellers and bidders among the persons generated so far (plus the
reference's small lead), bids on recent or hot auctions, expiry within the in-flight horizon, event times
at the configured rate, record sizes near the reference's averages, the fields of the schema module, and
determinism by seed.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.nexmark_suite.generator import (
    AUCTION_ID_LEAD,
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    HOT_CHANNELS,
    PERSON_ID_LEAD,
    Event,
    GeneratorConfig,
    generate,
)
from bench.nexmark_suite.model import AUCTION, BID, PERSON, TABLES_BY_NAME
from bench.nexmark_suite.producer import encode

seeds = st.integers(min_value=0, max_value=2**32)


def by_table(events: list[Event]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"person": [], "auction": [], "bid": []}
    for event in events:
        out[event.table.name].append(event.row)
    return out


@settings(max_examples=8, deadline=None)
@given(seed=seeds, events=st.integers(min_value=1, max_value=2000))
def test_mix_ids_and_references(seed: int, events: int) -> None:
    config = GeneratorConfig(seed=seed, events=events)
    stream = generate(config)
    assert [e.number for e in stream] == list(range(events))
    for event in stream:  # 1 person, 3 auctions, 46 bids in every 50 events, by position
        assert event.table.name == config.table_of(event.number)
        assert event.table.name == ("person" if event.number % 50 == 0 else
                                    "auction" if event.number % 50 < 4 else "bid")
        assert tuple(event.row) == event.table.fields  # the schema module's fields, in order
        assert event.row["date_time"] == event.date_time == config.timestamp_for_event(event.number)
    rows = by_table(stream)
    assert [p["id"] for p in rows["person"]] == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + len(rows["person"])))
    assert [a["id"] for a in rows["auction"]] == list(range(FIRST_AUCTION_ID,
                                                             FIRST_AUCTION_ID + len(rows["auction"])))
    persons_so_far = auctions_so_far = 0
    for event in stream:
        row = event.row
        if event.table is PERSON:
            persons_so_far += 1
        elif event.table is AUCTION:
            auctions_so_far += 1
            assert FIRST_PERSON_ID <= row["seller"] < FIRST_PERSON_ID + persons_so_far + PERSON_ID_LEAD
            assert 10 <= row["category"] <= 14
            assert row["date_time"] < row["expires"]
            assert row["reserve"] > row["initial_bid"] >= 100
        else:
            assert FIRST_PERSON_ID <= row["bidder"] < FIRST_PERSON_ID + persons_so_far + PERSON_ID_LEAD
            newest = FIRST_AUCTION_ID + auctions_so_far - 1
            assert newest - 100 - 1 <= row["auction"] <= newest + AUCTION_ID_LEAD or row["auction"] % 100 == 0
            assert 100 <= row["price"] <= 100_000_000


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    first = [e.row for e in generate(GeneratorConfig(seed=3, events=500))]
    assert first == [e.row for e in generate(GeneratorConfig(seed=3, events=500))]
    assert first != [e.row for e in generate(GeneratorConfig(seed=4, events=500))]
    # A longer stream starts with the shorter one (waves of one stream are prefixes of it).
    assert [e.row for e in generate(GeneratorConfig(seed=3, events=800))][:500] == first


def test_hot_keys_sizes_and_event_times() -> None:
    config = GeneratorConfig(seed=11, events=50_000, event_rate=5000)
    stream = generate(config)
    rows = by_table(stream)
    bids = rows["bid"]
    # Hot auction 1 time in 2 (plus chance), hot bidder 3 times in 4, hot channels 1 time in 2.
    hot_auction = sum(1 for b in bids if (b["auction"] - FIRST_AUCTION_ID) % 100 == 0) / len(bids)
    assert 0.45 < hot_auction < 0.6
    hot_bidder = sum(1 for b in bids if (b["bidder"] - FIRST_PERSON_ID) % 100 == 1) / len(bids)
    assert 0.7 < hot_bidder < 0.8
    assert 0.45 < sum(1 for b in bids if b["channel"] in HOT_CHANNELS) / len(bids) < 0.55
    hot_seller = sum(1 for a in rows["auction"] if (a["seller"] - FIRST_PERSON_ID) % 100 == 0) / len(rows["auction"])
    assert 0.7 < hot_seller < 0.8
    # Sizes as the reference counts them (8 bytes a number, the strings' lengths): near 200 / 500 / 100.
    def size(row: dict) -> int:
        return sum(8 if isinstance(v, int) else len(v) for k, v in row.items()
                   if k not in ("date_time", "url", "channel"))
    assert 180 < statistics.mean(size(p) for p in rows["person"]) < 220
    assert 460 < statistics.mean(size(a) for a in rows["auction"]) < 540
    assert 90 < statistics.mean(size(b) for b in bids) < 110
    # Event time advances at the rate: 50,000 events at 5,000/s span 10 s.
    assert stream[-1].date_time - stream[0].date_time == 9999
    # Auctions last on average the time of 100 auctions (1,666 events at 5,000/s: 333 ms), within +-20 %.
    lengths = [a["expires"] - a["date_time"] for a in rows["auction"]]
    assert 270 < statistics.mean(lengths) < 400
    # Most bids fall within their auction's life when the auction is known (what q4/q6/q9 join on).
    auctions = {a["id"]: a for a in rows["auction"]}
    within = Counter(auctions[b["auction"]]["date_time"] <= b["date_time"] <= auctions[b["auction"]]["expires"]
                     for b in bids if b["auction"] in auctions)
    assert within[True] > 0.2 * sum(within.values())


def test_messages_are_json_of_the_schema() -> None:
    for event in generate(GeneratorConfig(seed=5, events=200)):
        key, value = encode(event)
        decoded = json.loads(value)
        table = TABLES_BY_NAME[event.table.name]
        assert list(decoded) == list(table.fields)
        for name, kind in table.columns:
            assert isinstance(decoded[name], int if kind == "int" else str), (name, decoded[name])
        assert key == str(decoded[table.message_key]).encode()
    assert BID.key == () and PERSON.key == ("id",)
