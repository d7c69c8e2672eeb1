"""Chunked backfill (RFC 0013, "Backfilling 101"): a new view catches up with a live upstream without
pausing it and without buffering its stream.

Per upstream and vnode, a :class:`Position` says how far the backfill has got: the order member (see
:mod:`mvlog.key_order`) of the highest key already backfilled, or *done*. Each epoch ``e`` of the
upstream is turned into the view's input by :func:`route_epoch`:

* an upstream change is **forwarded** when its key is at or below its vnode's position (the view has
  that key already), and **dropped** otherwise (the backfill will read the key's row later);
* a :class:`Chunk` of the upstream's rows read from its serving state is emitted as inserts (``READ``
  changes) in epoch ``S``, the upstream epoch the rows reflect; its keys are beyond the positions
  before the chunk, so the upstream's own changes of epoch ``S`` (and earlier) to them are dropped and
  only changes of epochs after ``S`` are forwarded, once the positions have moved past them.

So at every epoch ``e`` the view holds exactly ``Q(rows of u at e whose key is covered)``; when every
vnode is done it holds ``Q(u at e)``. Positions are persisted with each epoch's commit, so a resumed
backfill redoes at most the one chunk per vnode that was in flight.

Also here: the chunk size that adapts to the measured barrier interval (RFC 0013's third option), the
optional rows/s rate limit, and the progress figures (rate, ETA). All pure: no I/O, time is passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mvlog.changes import Change, Op
from mvlog.key_order import member_key
from mvlog.row_schema import Row
from mvlog.vnode import VNODE_COUNT


class BackfillError(RuntimeError):
    """A chunk that does not continue the backfill from where it is (it would move backwards or skip)."""


@dataclass(frozen=True)
class Position:
    """How far one vnode is backfilled: ``last`` is the highest key's order member (None: nothing yet)."""

    done: bool = False
    last: bytes | None = None

    def covers(self, member: bytes) -> bool:
        """Is the key of ``member`` backfilled already (its changes are forwarded)?"""
        return self.done or (self.last is not None and member <= self.last)

    def is_after(self, other: Position) -> bool:
        """Strictly further than ``other`` (positions only ever move this way)."""
        if other.done:
            return False
        if self.done:
            return True
        return self.last is not None and (other.last is None or self.last > other.last)

    def encode(self) -> bytes:
        """Stored form: ``b""`` when done, else the member (a member is never empty)."""
        if self.done:
            return b""
        if self.last is None:
            raise ValueError("the start position is not stored (an absent field is the start)")
        return self.last

    @classmethod
    def decode(cls, value: bytes | None) -> Position:
        if value is None:
            return START
        return DONE if value == b"" else cls(False, value)


START = Position()
DONE = Position(done=True)


@dataclass(frozen=True)
class VnodeChunk:
    """Rows of one vnode after ``start``, in key order; ``end`` is the position once they are emitted
    (``DONE`` when the read reached the end of the vnode)."""

    vnode: int
    start: Position
    end: Position
    rows: tuple[tuple[bytes, Row], ...]  # (order member, row)


@dataclass(frozen=True)
class Chunk:
    """One read of an upstream's serving state: rows of one or more vnodes, all as of ``snapshot_epoch``."""

    source: str
    snapshot_epoch: int
    vnodes: tuple[VnodeChunk, ...]
    upstream_rows: int = 0  # the upstream's row count at the read: the backfill's estimated total

    @property
    def row_count(self) -> int:
        return sum(len(v.rows) for v in self.vnodes)


class BackfillPositions:
    """The positions of every vnode of every upstream of one view."""

    def __init__(self, sources: Iterable[str], stored: Mapping[tuple[str, int], Position] | None = None) -> None:
        self._positions: dict[str, list[Position]] = {s: [START] * VNODE_COUNT for s in sources}
        for (source, vnode), position in (stored or {}).items():
            self._positions[source][vnode] = position

    @property
    def sources(self) -> list[str]:
        return list(self._positions)

    def get(self, source: str, vnode: int) -> Position:
        return self._positions[source][vnode]

    def set(self, source: str, vnode: int, position: Position) -> None:
        """Put a position as committed (a rebuild from the view's changelog; no ordering check)."""
        self._positions[source][vnode] = position

    def covers(self, source: str, vnode: int, member: bytes) -> bool:
        return self._positions[source][vnode].covers(member)

    def unfinished(self, source: str) -> list[tuple[int, Position]]:
        """Vnodes still to backfill, in order: the plan of the next chunk."""
        return [(v, p) for v, p in enumerate(self._positions[source]) if not p.done]

    def vnodes_done(self) -> int:
        return sum(p.done for positions in self._positions.values() for p in positions)

    def vnodes_total(self) -> int:
        return VNODE_COUNT * len(self._positions)

    @property
    def done(self) -> bool:
        return all(p.done for positions in self._positions.values() for p in positions)

    def advance(self, chunk: Chunk) -> dict[tuple[str, int], Position]:
        """Move the chunk's vnodes to its end positions; returns what changed (to persist)."""
        moved: dict[tuple[str, int], Position] = {}
        for part in chunk.vnodes:
            current = self._positions[chunk.source][part.vnode]
            if part.start != current:
                raise BackfillError(f"{chunk.source} vnode {part.vnode}: chunk starts at {part.start}, "
                                    f"the backfill is at {current}")
            if part.end != current and not part.end.is_after(current):
                raise BackfillError(f"{chunk.source} vnode {part.vnode}: chunk would move back to {part.end}")
            if any(not (current.last is None or m > current.last) for m, _ in part.rows):
                raise BackfillError(f"{chunk.source} vnode {part.vnode}: chunk rows at or below the position")
            self._positions[chunk.source][part.vnode] = part.end
            moved[(chunk.source, part.vnode)] = part.end
        return moved

    def items(self) -> Iterable[tuple[tuple[str, int], Position]]:
        for source, positions in self._positions.items():
            for vnode, position in enumerate(positions):
                yield (source, vnode), position


@dataclass
class EpochInput:
    """An upstream epoch as the view's operator sees it during the backfill."""

    changes: dict[str, list[Change]]  # per upstream: forwarded changes, then the chunk's inserts
    forwarded: int = 0
    dropped: int = 0
    inserted: int = 0
    moved: dict[tuple[str, int], Position] = field(default_factory=dict)  # positions to persist


def route_epoch(positions: BackfillPositions, epoch: int,
                changes: Mapping[str, Sequence[tuple[int, bytes, Change]]],
                chunks: Sequence[Chunk] = (), prev_epoch: int | None = None) -> EpochInput:
    """Epoch ``epoch``'s view input: upstream changes (``(vnode, order member, change)``) forwarded or
    dropped by key position, plus the rows of ``chunks`` as inserts; ``positions`` advances past them.

    A chunk read at ``S == epoch`` already reflects this epoch's changes: they are routed by the
    positions *before* it. A chunk read at the upstream's previous epoch (``S == prev_epoch``, the
    variant of "Backfilling 101") does not: this epoch's changes are routed by the positions *after*
    it. Any other ``S`` would lose or double changes and is refused.
    """
    result = EpochInput({source: [] for source in positions.sources})
    after: list[Chunk] = []
    for chunk in chunks:
        if chunk.snapshot_epoch == epoch:
            after.append(chunk)
        elif prev_epoch is not None and chunk.snapshot_epoch == prev_epoch:
            _emit(positions, chunk, result)
        else:
            raise BackfillError(f"a chunk read at epoch {chunk.snapshot_epoch} cannot be emitted in epoch {epoch}")
    for source, source_changes in changes.items():
        out = result.changes[source]
        for vnode, member, change in source_changes:
            if positions.covers(source, vnode, member):
                out.append(change)
                result.forwarded += 1
            else:
                result.dropped += 1
    for chunk in after:
        _emit(positions, chunk, result)
    return result


def _emit(positions: BackfillPositions, chunk: Chunk, result: EpochInput) -> None:
    result.moved.update(positions.advance(chunk))
    out = result.changes[chunk.source]
    for part in chunk.vnodes:
        for member, row in part.rows:
            out.append(Change(Op.READ, member_key(member), None, row))
        result.inserted += len(part.rows)


@dataclass
class BatchSizer:
    """Rows per chunk, adapted to the measured barrier interval (RFC 0013, third option).

    The time a view takes to process an epoch is the delay it adds to that epoch's barrier. When it is
    above ``target_s`` (a share of the system's barrier interval, leaving room for the upstream's own
    changes) the size shrinks in proportion (at most to a quarter); when below, it grows in proportion
    (at most by ``growth``), so it settles where an epoch with a chunk costs about the target. The fixed
    cost of an epoch (its Kafka transaction and Redis commit, learned from epochs without a chunk) is
    taken out of both, so only the chunk's own time is scaled.
    """

    target_s: float
    size: int = 1_000
    minimum: int = 50
    maximum: int = 500_000
    growth: float = 1.5
    overhead_s: float = 0.0  # learned from epochs without a chunk

    def observe(self, interval_s: float, rows: int) -> int:
        """An epoch with a chunk of ``rows`` rows took ``interval_s``: adapt the size."""
        # What the chunk may add to an epoch's fixed cost; when the fixed cost alone exceeds the target
        # (a loaded machine), a quarter of the target still: shrinking further would only stall the
        # backfill, since the upstream never waits for this view's barriers.
        spare = max(self.target_s - self.overhead_s, self.target_s / 4)
        used = interval_s - self.overhead_s
        factor = spare / used if used > 0 else self.growth
        factor = min(self.growth, max(0.25, factor))
        if factor < 1 or rows >= self.size // 2:  # only a chunk that used its size says it could be larger
            self.size = min(self.maximum, max(self.minimum, int(self.size * factor)))
        return self.size

    def observe_without_chunk(self, interval_s: float) -> None:
        """An epoch without a chunk: what every epoch costs anyway (Kafka transaction, Redis commit)."""
        self.overhead_s = interval_s if self.overhead_s == 0 else 0.8 * self.overhead_s + 0.2 * interval_s


@dataclass
class RateLimit:
    """A token bucket of rows/s (None: no cap) whose rate may change while it runs; bursts up to 1 s."""

    rows_per_s: int | None
    now: float
    tokens: float = 0.0

    def set_rate(self, rows_per_s: int | None, now: float) -> None:
        self._refill(now)
        self.rows_per_s = rows_per_s

    def allowance(self, now: float) -> int | None:
        """Rows a chunk may hold now (None: unlimited)."""
        self._refill(now)
        return None if self.rows_per_s is None else int(self.tokens)

    def spend(self, rows: int, now: float) -> None:
        self._refill(now)
        if self.rows_per_s is not None:
            self.tokens -= rows

    def _refill(self, now: float) -> None:
        if self.rows_per_s is not None:
            self.tokens = min(float(self.rows_per_s), self.tokens + (now - self.now) * self.rows_per_s)
        self.now = now


@dataclass
class RateMeter:
    """Rows/s over the last ``window_s`` seconds, and the ETA it implies."""

    window_s: float = 10.0
    _samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, now: float, rows_done: int) -> None:
        self._samples.append((now, rows_done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, r0), (t1, r1) = self._samples[0], self._samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self, remaining: int) -> float | None:
        rate = self.rate()
        if remaining <= 0:
            return 0.0
        return remaining / rate if rate > 0 else None
