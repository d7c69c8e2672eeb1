"""Chunked backfill, pure logic: key order, the forward/drop rule, positions, batch size, rate limit."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvlog.backfill import (
    DONE,
    START,
    BackfillError,
    BackfillPositions,
    BatchSizer,
    Chunk,
    Position,
    RateLimit,
    RateMeter,
    VnodeChunk,
    route_epoch,
)
from mvlog.changes import Change, Op, apply_changes
from mvlog.key_order import decode_ordered_key, member_avro_key, member_key, order_member, ordered_key
from mvlog.row_schema import Key, Row, RowSchema
from mvlog.schemas.codec import encode_key
from mvlog.views import ChangeBatch, ViewOperator, plan_view

# --- key order ------------------------------------------------------------------------------------

ints = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
floats = st.floats(allow_nan=False).map(lambda f: 0.0 if f == 0 else f)  # -0.0 == 0.0 but encodes apart
texts = st.text()
blobs = st.binary()
column_values = st.sampled_from([ints, floats, texts, blobs, st.booleans()])


@given(st.lists(column_values, min_size=1, max_size=3).flatmap(
    lambda kinds: st.tuples(st.tuples(*kinds), st.tuples(*kinds))))
def test_ordered_keys_compare_as_the_keys_do(pair: tuple[Key, Key]) -> None:
    a, b = pair
    ea, eb = ordered_key(a), ordered_key(b)
    assert (ea < eb) == (a < b) and (ea == eb) == (a == b)
    assert decode_ordered_key(ea) == a


@given(st.tuples(ints, texts), st.tuples(ints, texts), st.integers(0, 255))
def test_members_sort_by_vnode_then_key_and_carry_the_avro_key(a: Key, b: Key, vnode: int) -> None:
    columns = ("id", "name")
    ma, mb = (order_member(vnode, k, encode_key(columns, k)) for k in (a, b))
    assert (ma < mb) == (a < b)
    assert member_avro_key(ma) == encode_key(columns, a) and member_key(ma) == a
    assert order_member(vnode, a, b"") < order_member(vnode + 1, (-(1 << 63), ""), b"") if vnode < 255 else True


# --- helpers for routing --------------------------------------------------------------------------

SCHEMA = RowSchema.of({"id": "int", "name": "string"}, ["id"])


def member(key: int, vnode: int = 0) -> bytes:
    return order_member(vnode, (key,), encode_key(("id",), (key,)))


def chunk_of(positions: BackfillPositions, source: str, snapshot: int, rows: Mapping[int, Row], vnode: int,
             size: int) -> Chunk:
    """What ``read_ordered`` returns: up to ``size`` rows of ``vnode`` after its position, in key order."""
    start = positions.get(source, vnode)
    after = [(member(k, vnode), r) for k, r in sorted(rows.items())
             if start.last is None or member(k, vnode) > start.last]
    taken = after[:size]
    end = DONE if len(taken) < size else Position(False, taken[-1][0])
    return Chunk(source, snapshot, (VnodeChunk(vnode, start, end, tuple(taken)),))


def changes_of(before: Mapping[int, Row], after: Mapping[int, Row]) -> list[Change]:
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        op = Op.CREATE if old is None else Op.DELETE if new is None else Op.UPDATE
        out.append(Change(op, (key,), old, new))
    return out


def routed(changes: Sequence[Change], vnode_of_key: Mapping[int, int] | None = None
           ) -> list[tuple[int, bytes, Change]]:
    vnodes = vnode_of_key or {}
    return [(vnodes.get(c.key[0], 0), member(c.key[0], vnodes.get(c.key[0], 0)), c) for c in changes]


def row(key: int, name: str) -> Row:
    return {"id": key, "name": name}


def batches(changes: dict[str, list[Change]]) -> dict[str, ChangeBatch]:
    """A backfill step's changes (the row form) as the operator's input."""
    return {name: ChangeBatch.from_changes(SCHEMA, found) for name, found in changes.items()}


# --- Backfilling 101, step by step ------------------------------------------------------------------

def test_backfilling_101_worked_example() -> None:
    """The worked example: ``mv = SELECT * FROM t``; in epoch B the backfill emits t's rows up to id 2 as
    of epoch A, and of B's own changes only those at or below id 2 (the delete of id 1)."""
    plan = plan_view("mv", "SELECT * FROM t", {"t": SCHEMA})
    operator = ViewOperator(plan)
    state: dict[bytes, bytes] = {}

    class State:
        def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
            return {k: state[k] for k in keys if k in state}

    a, b, c, d = 100, 200, 300, 400  # epochs
    t_at_a = {1: row(1, "a"), 2: row(2, "b"), 3: row(3, "c"), 99: row(99, "zzz")}
    t_at_b = {2: row(2, "b"), 3: row(3, "c"), 4: row(4, "d"), 100: row(100, "zzzz")}  # +4 d, -1 a, -99, +100
    positions = BackfillPositions(["t"])
    view: dict[Key, Row] = {}

    # Epoch B: historical rows up to id 2 read at A, then B's changes up to id 2.
    step = route_epoch(positions, b, {"t": routed(changes_of(t_at_a, t_at_b))},
                       [chunk_of(positions, "t", a, t_at_a, 0, 2)], prev_epoch=a)
    sent = [(ch.op, ch.key[0], (ch.after or ch.before or {})["name"]) for ch in step.changes["t"]]
    assert sent == [(Op.READ, 1, "a"), (Op.READ, 2, "b"), (Op.DELETE, 1, "a")]
    assert (step.inserted, step.forwarded, step.dropped) == (2, 1, 3)  # +4, -99, +100 are beyond id 2
    assert positions.get("t", 0) == Position(False, member(2))
    output = operator.apply_epoch(batches(step.changes), State())
    apply_changes(view, output.changes.to_changes())
    assert view == {(2,): row(2, "b")}  # = t at B restricted to ids <= 2: nothing buffered, nothing lost

    # Epoch C: the next chunk (ids 3, 4 as of B); C updates 2 (forwarded) and 50 (beyond: dropped).
    t_at_c = {**t_at_b, 2: row(2, "B"), 50: row(50, "x")}
    step = route_epoch(positions, c, {"t": routed(changes_of(t_at_b, t_at_c))},
                       [chunk_of(positions, "t", b, t_at_b, 0, 2)], prev_epoch=b)
    apply_changes(view, operator.apply_epoch(batches(step.changes), State()).changes.to_changes())
    assert view == {(k,): r for k, r in t_at_c.items() if k <= 4}
    assert step.dropped == 1 and step.forwarded == 1

    # Epoch D: a chunk of 3 finds 2 rows (50, 100): the end of the vnode, which is done; the view is t.
    step = route_epoch(positions, d, {"t": []}, [chunk_of(positions, "t", c, t_at_c, 0, 3)], prev_epoch=c)
    assert positions.get("t", 0) == DONE and step.inserted == 2
    apply_changes(view, operator.apply_epoch(batches(step.changes), State()).changes.to_changes())
    assert view == {(k,): r for k, r in t_at_c.items()}


# --- the invariant on random workloads ------------------------------------------------------------

epochs_of_writes = st.lists(st.dictionaries(st.integers(0, 40), st.one_of(st.none(), st.text(max_size=2)),
                                            max_size=8), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(epochs_of_writes, st.integers(1, 6), st.booleans(), st.lists(st.integers(0, 3), min_size=41, max_size=41))
def test_view_is_the_upstream_restricted_to_covered_keys_at_every_epoch(
        writes: list[dict[int, str | None]], size: int, rfc_variant: bool, vnodes: list[int]) -> None:
    """At every epoch the view = the upstream's rows whose key is covered; once done, the upstream.

    Both emission variants: a chunk read at the previous epoch ("Backfilling 101") or at the epoch itself.
    """
    vnode_of_key = dict(enumerate(vnodes))
    upstream: dict[int, Row] = {k: row(k, "init") for k in range(0, 41, 3)}
    positions = BackfillPositions(["t"])
    view: dict[Key, Row] = {}
    epoch = 1
    history = list(writes) + [{}] * 60  # idle epochs until the backfill is done
    for batch in history:
        before = dict(upstream)
        for key, name in batch.items():
            if name is None:
                upstream.pop(key, None)
            else:
                upstream[key] = row(key, name)
        epoch += 1
        snapshot = before if rfc_variant else upstream
        unfinished = positions.unfinished("t")
        chunks = []
        if unfinished:
            v = unfinished[0][0]
            rows_of_v = {k: r for k, r in snapshot.items() if vnode_of_key[k] == v}
            chunks.append(chunk_of(positions, "t", epoch - 1 if rfc_variant else epoch, rows_of_v, v, size))
        old = {vn: positions.get("t", vn) for vn in range(4)}
        step = route_epoch(positions, epoch, {"t": routed(changes_of(before, upstream), vnode_of_key)}, chunks,
                           prev_epoch=epoch - 1)
        for vn in range(4):
            assert positions.get("t", vn) == old[vn] or positions.get("t", vn).is_after(old[vn])  # I5
        apply_changes(view, step.changes["t"])
        covered = {(k,): r for k, r in upstream.items()
                   if positions.covers("t", vnode_of_key[k], member(k, vnode_of_key[k]))}
        assert view == covered, f"epoch {epoch}"
    assert all(positions.get("t", v).done for v in set(vnodes)) and view == {(k,): r for k, r in upstream.items()}


def test_chunks_that_would_skip_or_go_back_are_refused() -> None:
    positions = BackfillPositions(["t"])
    ahead = Chunk("t", 5, (VnodeChunk(0, Position(False, member(3)), Position(False, member(5)), ()),))
    with pytest.raises(BackfillError, match="starts at"):
        route_epoch(positions, 5, {}, [ahead])
    with pytest.raises(BackfillError, match="cannot be emitted in epoch 6"):
        route_epoch(positions, 6, {}, [Chunk("t", 4, ())], prev_epoch=5)
    positions.advance(Chunk("t", 5, (VnodeChunk(0, START, Position(False, member(5)), ((member(5), row(5, "")),)),)))
    back = Chunk("t", 6, (VnodeChunk(0, Position(False, member(5)), Position(False, member(4)), ()),))
    with pytest.raises(BackfillError, match="move back"):
        positions.advance(back)


def test_positions_round_trip_through_their_stored_form() -> None:
    assert Position.decode(None) == START and Position.decode(DONE.encode()) == DONE
    assert Position.decode(Position(False, member(7)).encode()) == Position(False, member(7))


# --- batch size and rate limit --------------------------------------------------------------------

@given(st.lists(st.floats(0.001, 5.0), min_size=1, max_size=50))
def test_batch_size_shrinks_when_epochs_take_longer_than_the_target_and_stays_in_bounds(times: list[float]) -> None:
    sizer = BatchSizer(target_s=0.1, size=1000, minimum=50, maximum=100_000)
    for seconds in times:
        before = sizer.size
        after = sizer.observe(seconds, before)
        assert 50 <= after <= 100_000
        assert (after <= before) if seconds > 0.1 else (after >= before)


def test_batch_size_leaves_the_fixed_cost_of_an_epoch_out() -> None:
    sizer = BatchSizer(target_s=0.1, size=100, maximum=10**7)
    for _ in range(5):
        sizer.observe_without_chunk(0.06)  # every epoch costs 60 ms anyway
    for _ in range(60):  # plus 10 us per row of its chunk: 40 ms left for 4,000 rows
        sizer.observe(0.06 + sizer.size * 10e-6, sizer.size)
    assert 3_600 <= sizer.size <= 4_400


def test_batch_size_converges_where_a_chunk_costs_the_target() -> None:
    sizer = BatchSizer(target_s=0.1, size=100, maximum=10**7)
    for _ in range(60):  # a chunk costs 10 us per row: the target allows 10,000 rows
        sizer.observe(sizer.size * 10e-6, sizer.size)
    assert 9_000 <= sizer.size <= 11_000


@given(st.integers(1, 10_000), st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40))
def test_rate_limit_never_lets_more_rows_through_than_the_rate_allows(rate: int, gaps: list[float]) -> None:
    now = 0.0
    limit = RateLimit(rate, now)
    spent = 0
    for gap in gaps:
        now += gap
        allowed = limit.allowance(now)
        assert allowed is not None
        limit.spend(allowed, now)
        spent += allowed
    assert spent <= rate * now + 1e-6 * rate  # no initial burst: tokens accrue from the start


def test_rate_limit_changes_apply_while_running() -> None:
    limit = RateLimit(None, 0.0)
    assert limit.allowance(1.0) is None
    limit.set_rate(100, 1.0)
    assert limit.allowance(1.5) == 50
    limit.set_rate(None, 2.0)
    assert limit.allowance(2.0) is None


def test_rate_meter_gives_rate_and_eta() -> None:
    meter = RateMeter(window_s=10)
    for t in range(5):
        meter.add(float(t), t * 1000)
    assert math.isclose(meter.rate(), 1000.0) and meter.eta_s(5000) == pytest.approx(5.0)
    assert RateMeter().eta_s(10) is None
