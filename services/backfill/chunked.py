"""Chunked backfill of a view on a live upstream: the I/O around :mod:`mvlog.backfill`.

A :class:`ChunkedBackfill` sits between a view's upstream epochs and its operator. For every upstream
epoch, :meth:`ChunkedBackfill.prepare` returns the operator's input (the upstream changes at or below
the positions, then at most one chunk per upstream read from the upstream's serving state in Redis)
and the fields the caller must commit *with that epoch* (positions, rows done, lifecycle);
:meth:`ChunkedBackfill.committed` is called once that commit succeeded. It writes nothing itself, so
the same object hydrates a view that writes its changelog (``ViewConsumer``) or one that only fills
its Redis state (a staged replacement): the caller is the sink.

Chunks: ``read_ordered`` returns up to ``size`` rows of the unfinished vnodes in key order together
with the upstream MCE ``S`` they reflect. A chunk is emitted in epoch ``S`` itself: when the view is
still behind ``S`` the chunk waits (one per upstream, so memory stays at one batch) while the earlier
epochs' changes to its keys are dropped. The batch size follows the measured epoch time
(:class:`~mvlog.backfill.BatchSizer`), capped by the view's ``backfill_rate_limit`` option (rows/s),
which is re-read from the catalog every second, so ``mvlog alter-view`` applies while it runs.

Redis (``<prefix>:{view}:...``), for ``mvlog status`` and the dashboard:

* ``backfill`` (hash, committed with each epoch): ``pos:<upstream>:<vnode>`` = order member of the last
  backfilled key (empty: vnode done; absent: not started), ``rows_done``, ``start_epoch``, ``done``.
* ``journal`` (list, committed with each epoch): ``<epoch> <upstream> <vnode> <from> <to>`` per chunk
  part (members in hex, ``-`` = start, ``done``).
* ``backfill_progress`` (hash, written after each commit, at most twice a second): ``state``
  (backfilling|live), ``method``, ``rows_done``, ``rows_total`` (estimate: the upstreams' row counts at
  the last read), ``vnodes_done``, ``vnodes_total``, ``rate_rows_s``, ``eta_s`` (empty when unknown),
  ``batch_size``, ``rate_limit`` (empty: none), ``snapshot_epoch`` (S of the last chunk), ``mce``,
  ``started_ms``, ``updated_ms``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from mvlog.backfill import (
    DONE,
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
from mvlog.backfill_record import (
    BACKFILL_MUTATION,
    journal_line,
    load_positions,
    position_field,
    position_text,
    progress_payload,
)
from mvlog.catalog import CatalogEntry
from mvlog.changes import Change, Mutation
from mvlog.config import Settings
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.view_rows import OrderedRead
from mvlog.connectors.redis.view_store import Lifecycle, ViewStore
from mvlog.key_order import order_member
from mvlog.row_schema import Key
from mvlog.schemas.codec import decode_row, encode_key
from mvlog.services.backfill.task_chunks import BackfillBatch, TaskChunk, committed_positions, recover_chunk
from mvlog.services.view_ddl import view_option
from mvlog.views import ChangeBatch
from mvlog.vnode import VNODE_COUNT, vnode_of

log = logging.getLogger(__name__)

RATE_LIMIT_REFRESH_S = 1.0
PROGRESS_EVERY_S = 0.5


@dataclass
class BackfillStep:
    """One epoch of the backfill: the operator's input and what to commit with the epoch."""

    epoch: int
    changes: dict[str, list[Change]]
    fields: dict[str, bytes | str | int] = field(default_factory=dict)
    journal: list[str] = field(default_factory=list)
    lifecycle: str = ""
    inserted: int = 0
    forwarded: int = 0
    dropped: int = 0

    def commit_fields(self) -> dict[str, object]:
        """Keyword arguments of :class:`~mvlog.connectors.redis.view_store.EpochCommit` for this step."""
        return {"backfill": self.fields, "journal": self.journal, "lifecycle": self.lifecycle}

    def mutation(self, view: str) -> Mutation:
        """The same fields on the epoch's barriers, so a rebuild from Kafka restores them (I6)."""
        return Mutation(BACKFILL_MUTATION, view, progress_payload(self.fields))


class ChunkedBackfill:
    """Backfills view ``entry`` from its upstreams' serving state, resuming from committed positions."""

    def __init__(self, settings: Settings, store: ViewStore, catalog: CatalogStore, entry: CatalogEntry,
                 upstreams: Mapping[str, CatalogEntry], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.entry = entry
        self.view = entry.name
        self.upstreams = dict(upstreams)
        self.sources = list(entry.sources)
        self._clock = clock
        stored = store.backfill_state(self.view)
        self.positions = load_positions(stored, self.sources)
        self.rows_done = int(stored.get(b"rows_done", b"0"))
        if b"start_epoch" in stored:  # resuming: 0 too is a start (an upstream with a single epoch then)
            self.start_epoch = int(stored[b"start_epoch"])
        else:  # nothing committed yet: start just below the upstreams' current epoch
            self.start_epoch = min(self._epoch_before_mce(s) for s in self.sources)
        self._first_commit = True
        self.sizer = BatchSizer(target_s=settings.barrier_interval_ms / 1000 * settings.backfill_target_share,
                                size=settings.backfill_batch_rows, maximum=settings.backfill_max_batch_rows)
        now = clock()
        self.limit = RateLimit(view_option(entry, "backfill_rate_limit"), now)
        self._limit_checked = now
        self.meter = RateMeter()
        self._pending: dict[str, Chunk] = {}
        self._held: OrderedRead | None = None  # the task path's chunk read past its micro-batch
        self._held_source = ""  # ... of this upstream
        self._clean_after: int | None = None  # the task path's MCE above which no partition committed
        self._totals: dict[str, int] = {}
        self.snapshot_epoch = 0
        self.chunks_read = 0
        self._progress_at = 0.0
        self._started_ms = int(time.time() * 1000)
        self.on_chunk_read: Callable[[Chunk], None] | None = None  # observers (tests, progress bars)

    @property
    def done(self) -> bool:
        return self.positions.done

    @property
    def rows_total(self) -> int:
        return max(self.rows_done, sum(self._totals.values()))

    # --- per epoch --------------------------------------------------------------------------------

    def prepare(self, epoch: int, changes: Mapping[str, Sequence[Change]]) -> BackfillStep:
        """The view's input for upstream epoch ``epoch`` (positions advance; commit ``commit_fields``)."""
        self._refresh_rate_limit()
        self._held = None  # read by the task path at the positions this epoch may move
        chunks: list[Chunk] = []
        for source in self.sources:
            chunk = self._pending.pop(source, None)
            if chunk is None or chunk.snapshot_epoch < epoch:
                chunk = self._read_chunk(source, epoch)
            if chunk is None:
                continue
            if chunk.snapshot_epoch > epoch:
                self._pending[source] = chunk  # emitted in epoch S; earlier changes to its keys are dropped
            else:
                chunks.append(chunk)
        routed = route_epoch(self.positions, epoch, {s: self._with_members(s, c) for s, c in changes.items()},
                             chunks)
        self.rows_done += routed.inserted
        step = BackfillStep(epoch, routed.changes, inserted=routed.inserted, forwarded=routed.forwarded,
                            dropped=routed.dropped)
        step.fields = {position_field(s, v): p.encode() for (s, v), p in routed.moved.items()}
        step.fields["rows_done"] = self.rows_done
        step.fields["start_epoch"] = self.start_epoch
        for chunk in chunks:
            self.snapshot_epoch = chunk.snapshot_epoch
            step.journal += [journal_line(epoch, chunk.source, p.vnode, p.start, p.end) for p in chunk.vnodes]
        if self.positions.done:
            step.fields["done"] = 1
            step.lifecycle = Lifecycle.LIVE.value
        elif self._first_commit:
            step.lifecycle = Lifecycle.BACKFILLING.value
        return step

    def committed(self, step: BackfillStep, busy_s: float) -> None:
        """``step`` is committed: adapt the batch size to the epoch's time and publish progress."""
        self._after_commit(step.epoch, step.inserted, busy_s)

    def _after_commit(self, epoch: int, inserted: int, busy_s: float) -> None:
        self._first_commit = False
        if inserted:
            self.sizer.observe(busy_s, inserted)
        else:
            self.sizer.observe_without_chunk(busy_s)
        now = self._clock()
        self.meter.add(now, self.rows_done)
        if self.done or now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            self.store.set_backfill_progress(self.view, self.progress(epoch))

    def progress(self, mce: int) -> dict[str, str | int | float]:
        remaining = self.rows_total - self.rows_done
        eta = self.meter.eta_s(remaining) if not self.done else 0.0
        return {
            "state": Lifecycle.LIVE.value if self.done else Lifecycle.BACKFILLING.value, "method": "chunked",
            "rows_done": self.rows_done, "rows_total": self.rows_total,
            "vnodes_done": self.positions.vnodes_done(), "vnodes_total": self.positions.vnodes_total(),
            "rate_rows_s": round(self.meter.rate(), 1), "eta_s": "" if eta is None else round(eta, 1),
            "batch_size": self.sizer.size, "rate_limit": self.limit.rows_per_s or "",
            "snapshot_epoch": self.snapshot_epoch, "mce": mce, "started_ms": self._started_ms,
            "updated_ms": int(time.time() * 1000),
        }

    # --- internals --------------------------------------------------------------------------------

    def _epoch_before_mce(self, source: str) -> int:
        """The upstream's committed epoch before its MCE: starting there, the view has at least one
        upstream epoch (the MCE) to emit a first chunk in, even when the upstream writes nothing more."""
        mce = self.store.mce(source)
        if mce is None:
            return 0
        before = self.store.index.before(source, 0, mce)
        return before.epoch if before is not None else 0

    def _with_members(self, source: str, changes: Sequence[Change]) -> list[tuple[int, bytes, Change]]:
        columns = self.upstreams[source].key_columns
        out = []
        for change in changes:
            key = encode_key(columns, change.key)
            vnode = vnode_of(key)
            out.append((vnode, order_member(vnode, change.key, key), change))
        return out

    def _refresh_rate_limit(self) -> None:
        now = self._clock()
        if now - self._limit_checked >= RATE_LIMIT_REFRESH_S:
            self._limit_checked = now
            entry = self.catalog.find(self.view)
            if entry is not None:
                self.limit.set_rate(view_option(entry, "backfill_rate_limit"), now)

    def _read_chunk(self, source: str, epoch: int) -> Chunk | None:
        read = self._read(source)
        if read is None or read.epoch is None or read.epoch < epoch:
            return None  # the upstream's serving state is behind the epoch at hand: try the next one
        return self._chunk(source, read, decode=True)

    def _read(self, source: str) -> OrderedRead | None:
        """The next rows of the upstream's unfinished vnodes in key order, up to the batch size and the rate
        limit's allowance, with the upstream MCE they reflect (None: nothing to read now)."""
        unfinished = self.positions.unfinished(source)
        if not unfinished:
            return None
        budget = self.sizer.size
        allowance = self.limit.allowance(self._clock())
        if allowance is not None:
            budget = min(budget, allowance)
        if budget <= 0:
            return None
        return self.store.read_ordered(source, [(v, p.last) for v, p in unfinished], budget)

    def _chunk(self, source: str, read: OrderedRead, *, decode: bool) -> Chunk:
        """``read`` as a chunk (its rows decoded, or left out when the tasks decode them), counted."""
        assert read.epoch is not None
        self._totals[source] = read.row_count
        parts = []
        for vnode, exhausted, rows in read.parts:
            start = self.positions.get(source, vnode)
            end = DONE if exhausted else Position(False, rows[-1][0])
            decoded = tuple((m, decode_row(v)) for m, v in rows) if decode else ()
            parts.append(VnodeChunk(vnode, start, end, decoded))
        chunk = Chunk(source, read.epoch, tuple(parts), read.row_count)
        self.limit.spend(sum(len(rows) for _, _, rows in read.parts), self._clock())
        self.chunks_read += 1
        if self.on_chunk_read is not None:
            self.on_chunk_read(chunk)
        return chunk

    # --- the task path (mvlog.services.backfill.task_chunks) --------------------------------------

    def plan_in_tasks(self, settings_json: str, after: int, upto: int) -> BackfillBatch:
        """The next micro-batch of a view whose operator runs in tasks, after upstream epoch ``after`` and
        up to ``upto`` at most: up to the epoch of its chunk when it has one (the saved chunk of an earlier
        attempt, or one read now and saved), every change routed by the committed positions.

        Unless this backfill committed the micro-batch that ended at ``after``, a partition may have
        committed epochs above it (a consumer died, Redis was wiped under a micro-batch): a chunk one of
        them emitted is made again when its saved copy is gone, and a new one must come after them
        (:func:`~mvlog.services.backfill.task_chunks.recover_chunk`)."""
        source = self._chunk_source()
        self._pending.clear()  # read by the driver path at the positions this micro-batch may move
        chunk, floor = self._saved_chunk(after), after
        if chunk is None and self._clean_after != after:
            chunk, floor = recover_chunk(self.settings, self.store, self.entry, self.upstreams, after,
                                         self.positions, self.rows_done, self._first_commit)
            if chunk is not None:
                log.warning("%s: the chunk of epoch %d, which a partition committed, was lost from Redis: read "
                            "again (%d rows)", self.view, chunk.epoch, chunk.rows)
        if chunk is None:
            chunk = self._new_task_chunk(source, floor, upto)
        positions = {name: committed_positions([self.positions.get(name, v) for v in range(VNODE_COUNT)])
                     for name in self.sources}
        return BackfillBatch(settings_json, self.view, self.upstreams, positions, self.rows_done,
                             self.start_epoch, chunk.epoch if chunk is not None else upto, chunk,
                             tuple(self.store.chunk_keys(self.view)))

    def _chunk_source(self) -> str:
        """The upstream the task path's next chunk is read from: the first one not done (a micro-batch
        emits one chunk; a join's sides are backfilled one after the other)."""
        return next((s for s in self.sources if self.positions.unfinished(s)), self.sources[0])

    def committed_in_tasks(self, batch: BackfillBatch, busy_s: float) -> None:
        """``batch``'s epochs are committed: the chunk's positions are the backfill's now."""
        chunk = batch.chunk
        if chunk is not None:
            for vnode, end in chunk.ends().items():
                self.positions.set(chunk.source, vnode, end)
            self.rows_done, self.snapshot_epoch = chunk.rows_done, chunk.epoch
            self._held = None  # read at the positions before
        self._clean_after = batch.upto
        self._after_commit(batch.upto, chunk.rows if chunk is not None else 0, busy_s)
        if self.done:
            log.info("%s: backfill done at epoch %d (%d rows), in tasks", self.view, batch.upto, self.rows_done)

    def reload(self) -> None:
        """Take the positions and counters committed in Redis (after a recovery, or a micro-batch that
        failed part way), and check the partitions again before the next chunk."""
        stored = self.store.backfill_state(self.view)
        self.positions = load_positions(stored, self.sources)
        self.rows_done = int(stored.get(b"rows_done", b"0"))
        self._held, self._clean_after = None, None

    def _saved_chunk(self, after: int) -> TaskChunk | None:
        """The chunk an earlier attempt saved and did not commit (it may have partly committed its epoch)."""
        record = self.store.chunk_record(self.view)
        if record is None:
            return None
        chunk = TaskChunk.from_json(record)
        if chunk.epoch <= after:  # committed (its commit drops it): left by a lost reply, say
            return None
        for vnode, start, _ in chunk.moves:
            if position_text(self.positions.get(chunk.source, vnode)) != start:
                raise BackfillError(f"{self.view}: the saved chunk of epoch {chunk.epoch} starts vnode {vnode} at "
                                    f"{start}, the committed position is elsewhere")
        if self.on_chunk_read is not None:  # read again, from its saved copy
            parts = tuple(VnodeChunk(v, self.positions.get(chunk.source, v), end, ())
                          for v, end in chunk.ends().items())
            self.on_chunk_read(Chunk(chunk.source, chunk.epoch, parts, chunk.rows))
        return chunk

    def _new_task_chunk(self, source: str, after: int, upto: int) -> TaskChunk | None:
        """A chunk read now and saved, if the upstream's state is at an epoch of (after, upto]; one read
        past ``upto`` (a catch-up's micro-batch) is held for a later micro-batch."""
        self._refresh_rate_limit()
        held = self._held if self._held is not None and self._held_source == source else None
        read = held if held is not None and (held.epoch or 0) > after else self._read(source)
        self._held = None
        if read is None or read.epoch is None or read.epoch <= after:
            return None
        if read.epoch > upto:
            self._held, self._held_source = read, source
            return None
        parts = self._chunk(source, read, decode=False).vnodes
        moves = {part.vnode: part.end for part in parts}
        done = all((moves.get(v, p) if s == source else p).done for (s, v), p in self.positions.items())
        rows = [row for _, _, found in read.parts for row in found]
        chunk = TaskChunk(self.view, source, read.epoch, len(rows),
                          TaskChunk.moves_of([(p.vnode, p.start, p.end) for p in parts]), self.rows_done + len(rows),
                          self.start_epoch, done, self._first_commit)
        self.store.save_chunk(self.view, chunk.to_json(), rows)
        return chunk


def coverage(positions: BackfillPositions, upstreams: Mapping[str, CatalogEntry]) -> Callable[[str, Key], bool]:
    """``covers(upstream, key)``: whether the backfill at ``positions`` has reached the upstream key."""
    columns = {name: entry.key_columns for name, entry in upstreams.items()}

    def covers(source: str, key: Key) -> bool:
        encoded = encode_key(columns[source], key)
        vnode = vnode_of(encoded)
        return positions.covers(source, vnode, order_member(vnode, key, encoded))

    return covers


def keep_covered(epochs: Mapping[int, dict[str, ChangeBatch]], covers: Callable[[str, Key], bool]) -> None:
    """Drop from each epoch's batches (per upstream) the changes of upstream keys ``covers`` says a
    backfill has not reached: a backfilling view's re-derivation in tasks, which reads whole upstreams."""
    for batches in epochs.values():
        for name, batch in batches.items():
            batches[name] = batch.where([covers(name, key) for key in batch.keys])


def backfill_needed(store: ViewStore, entry: CatalogEntry) -> bool:
    """A view created with ``--backfill chunked`` whose backfill has not completed."""
    return entry.options.get("backfill") == "chunked" and store.backfill_state(entry.name).get(b"done") is None
