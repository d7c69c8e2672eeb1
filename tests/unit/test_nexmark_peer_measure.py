"""The peers' outside view of an engine (bench/nexmark_suite/peers/measure.py, queries.py), without Kafka:
the result kept from each output encoding, the comparison with the expected rows, latency pairing, and the
DuckDB oracle on a hand-checked case."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.nexmark_suite.peers.measure import OutputTail, TailState, latencies  # noqa: E402
from bench.nexmark_suite.peers.queries import QUERIES, multiset, normalize_row, oracle_rows  # noqa: E402


def _tail(query: str, encoding: str) -> OutputTail:
    return OutputTail("127.0.0.1:1", QUERIES[query], "out", encoding)  # never started: _output is pure


def _bid(auction: int, price: int, date_time: int, bidder: int = 1) -> dict[str, Any]:
    return {"auction": auction, "bidder": bidder, "price": price, "channel": "c", "url": "u",
            "date_time": date_time, "extra": ""}


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 1)), max_size=40))
def test_tail_state_knows_when_the_multiset_equals_the_expected(changes: list[tuple[int, int]]) -> None:
    state = TailState()
    state.expect({(0,): 1, (1,): 2})
    counts: dict[tuple[int, ...], int] = {}
    for value, diff in changes:
        state.add((value,), diff)
        counts[(value,)] = counts.get((value,), 0) + diff
    assert state.matches == ({k: v for k, v in counts.items() if v} == {(0,): 1, (1,): 2})


def test_upserts_keep_the_last_row_per_key_and_tombstones_delete() -> None:
    tail = _tail("q17", "upsert")
    rows = [{"auction": 1, "day": "2023-11-14", "total_bids": n, "rank1_bids": n, "rank2_bids": 0, "rank3_bids": 0,
             "min_price": 5, "max_price": 5, "avg_price": 5.0, "sum_price": 5 * n} for n in (1, 2)]
    key = b'{"auction": 1, "day": "2023-11-14"}'
    tail.expect([normalize_row(QUERIES["q17"], rows[1])])
    seen = []
    for value in (encoded(rows[0]), encoded(rows[1]), None):  # an update, then a tombstone
        tail._output(key, value, 1.0)
        seen.append((tail.state.matches, len(tail.final_rows())))
    assert seen == [(False, 1), (True, 1), (False, 0)]


def test_diff_rows_retract_and_renamed_columns_are_mapped_back() -> None:
    tail = OutputTail("127.0.0.1:1", QUERIES["q3"], "out", "diff", renames={"auction_id": "id"})
    row = {"name": "n", "city": "c", "state": "OR", "auction_id": 7}
    tail._output(None, encoded({**row, "diff": 1, "time": 2}), 1.0)
    tail._output(None, encoded({**row, "diff": 1, "time": 4}), 1.0)
    tail._output(None, encoded({**row, "diff": -1, "time": 6}), 1.0)
    assert tail.final_rows() == [{"name": "n", "city": "c", "state": "OR", "id": 7}]


def test_append_latencies_pair_events_and_rows_in_order_per_key() -> None:
    query = QUERIES["q0"]
    events: list[tuple[float, str, dict[str, Any]]] = [
        (10.0, "bid", _bid(1, 5, 100)), (11.0, "bid", _bid(1, 6, 100)), (12.0, "bid", _bid(2, 5, 200)),
        (13.0, "person", {"id": 1})]
    outputs = [(10.5, _bid(1, 5, 100)), (11.25, _bid(1, 6, 100)), (14.0, _bid(2, 5, 200))]
    assert sorted(latencies(query, events, outputs, counted_from=0.0)) == [0.25, 0.5, 2.0]
    assert sorted(latencies(query, events, outputs, counted_from=11.0)) == [0.25, 2.0]  # warm-up left out


def test_updating_latencies_wait_for_the_row_that_counts_the_event() -> None:
    query = QUERIES["q17"]
    day = "2023-11-14"
    events = [(10.0, "bid", _bid(1, 5, 1_700_000_000_000)), (11.0, "bid", _bid(1, 7, 1_700_000_000_001))]
    outputs = [(10.4, {"auction": 1, "day": day, "total_bids": 1}), (11.1, {"auction": 1, "day": day, "total_bids": 1}),
               (11.9, {"auction": 1, "day": day, "total_bids": 2})]
    assert [round(x, 3) for x in latencies(query, events, outputs, 0.0)] == [0.4, 0.9]


def test_oracle_runs_each_query_in_duckdb() -> None:
    records = {
        "person": [{"id": 1, "name": "a", "email_address": "", "credit_card": "", "city": "Bend", "state": "OR",
                    "date_time": 0, "extra": ""}],
        "auction": [{"id": 1107, "item_name": "i", "description": "d", "initial_bid": 1, "reserve": 2,
                     "date_time": 0, "expires": 9, "seller": 1, "category": 10, "extra": ""}],
        "bid": [_bid(1107, 10, 1_700_000_000_000) | {"url": "http://n.com/a/b?x&channel_id=9", "channel": "ch"},
                _bid(1107, 20_000, 1_700_000_000_001) | {"channel": "Apple"}],
    }
    assert oracle_rows(QUERIES["q1"], records)[0][2] == 9.08
    assert multiset(oracle_rows(QUERIES["q2"], records)) == {(1107, 10): 1, (1107, 20_000): 1}
    assert oracle_rows(QUERIES["q3"], records) == [("a", "Bend", "OR", 1107)]
    assert oracle_rows(QUERIES["q17"], records) == [(1107, "2023-11-14", 2, 1, 1, 0, 10, 20_000, 10_005, 20_010)]
    assert sorted(oracle_rows(QUERIES["q21"], records)) == [(1107, 1, 10, "ch", "9"), (1107, 1, 20_000, "Apple", "0")]
    assert sorted(oracle_rows(QUERIES["q22"], records))[0][4:] == ("a", "b?x&channel_id=9", "")
    assert len(oracle_rows(QUERIES["q20"], records)) == 2


def encoded(row: dict[str, Any]) -> bytes:
    return json.dumps(row).encode()
