"""A chunked backfill of a view whose operator runs in Spark's tasks: the driver plans, the tasks route.

The driver path (:class:`~mvlog.services.backfill.stages.ChunkedBackfillStage`) routes every upstream
change by its key's position and adds a chunk, on the driver, epoch by epoch. Here the driver only
decides, once per micro-batch, and the tasks do the rest (:class:`BackfillBatch`):

1. The driver reads one chunk of the upstream's serving state in Redis, as of the upstream's MCE ``S``
   (:meth:`~mvlog.services.backfill.chunked.ChunkedBackfill.plan_in_tasks`), and ends the micro-batch
   at ``S``: every upstream change of the micro-batch is then routed by the positions the view committed
   (a chunk read at ``S`` reflects the changes of ``S`` and before, to keys beyond those positions), and
   the chunk is emitted in ``S``, after which the positions move. Its rows' bytes are saved in Redis
   with what it will commit (:class:`TaskChunk`), never decoded on the driver.
2. The tasks reading each upstream's changes keep those whose key is covered by that upstream's
   positions (:class:`CoveredRows`; a join has two upstreams, and a micro-batch's chunk is of one);
   tasks of their own read the chunk's rows from Redis and shape them as the data source's signed rows
   of epoch ``S``, inserts (:class:`ChunkRows`). Both go through the view's routing and shuffle, and the
   view's partition tasks compute, write and stage them as any epoch, each epoch's barriers carrying the
   backfill's ``backfill_progress`` mutation (:attr:`BackfillBatch.mutations`).
3. The driver commits each epoch with the backfill's fields, and ``S`` with the chunk's positions,
   journal and lifecycle, dropping the saved chunk in the same script
   (:class:`~mvlog.connectors.redis.partition_staging.BackfillCommit`).

The saved chunk is what makes a partly committed epoch ``S`` safe: a consumer that died after some
partitions committed it finds the chunk still saved (its commit drops it) and runs the same micro-batch
with the same rows, so the partitions not committed compute exactly what the others did. When Redis
lost it (wiped) after a partition committed ``S``, the chunk is made again from what that partition's
barrier of ``S`` carries (the positions it moved to) and the upstream's rows at ``S``
(:func:`recover_chunk`); when the partitions committed epochs without a chunk, the next chunk is read
at an epoch after them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from mvlog.backfill import DONE, START, BackfillError, BackfillPositions, Position
from mvlog.backfill_record import BACKFILL_MUTATION, journal_line, position_field, position_text, progress_payload
from mvlog.catalog import CatalogEntry
from mvlog.changes import Mutation
from mvlog.config import Settings
from mvlog.connectors.kafka.partition_tail import barriers_above
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.backfill_store import BackfillStore
from mvlog.connectors.redis.partition_staging import BackfillCommit
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.connectors.rows_at_epoch import rows_at_epoch
from mvlog.connectors.spark.change_rows import BARRIER, SignedRowBuilder
from mvlog.connectors.spark.spark_source import spark_schema_ddl
from mvlog.key_order import member_avro_key, order_member, order_members
from mvlog.partition_epochs import PartitionBarrier
from mvlog.schemas.codec import decode_row, encode_key, encode_row
from mvlog.vnode import VNODE_COUNT, partition_of_vnode, vnode_of

#: Rows of the saved chunk a task of :class:`ChunkRows` reads.
ROWS_PER_TASK = 50_000


def _position(text: str) -> Position:
    """The inverse of :func:`~mvlog.backfill_record.position_text`."""
    return DONE if text == "done" else START if text == "-" else Position(False, bytes.fromhex(text))


@dataclass(frozen=True)
class TaskChunk:
    """One chunk of a backfill in tasks, emitted in upstream epoch ``epoch`` (the last of its micro-batch),
    and what its commit writes."""

    view: str
    source: str
    epoch: int
    rows: int
    moves: tuple[tuple[int, str, str], ...]  # (vnode, start, end), positions as journal texts
    rows_done: int  # after this chunk
    start_epoch: int
    done: bool  # every vnode done after it
    first: bool  # the backfill's first commit (the view's lifecycle becomes "backfilling")

    def ends(self) -> dict[int, Position]:
        """The positions of the vnodes it moves, once committed."""
        return {v: _position(end) for v, _, end in self.moves}

    def fields(self) -> dict[str, bytes | str | int]:
        fields: dict[str, bytes | str | int] = {position_field(self.source, v): end.encode()
                                                for v, end in self.ends().items()}
        fields.update(rows_done=self.rows_done, start_epoch=self.start_epoch)
        if self.done:
            fields["done"] = 1
        return fields

    def journal(self) -> list[str]:
        return [journal_line(self.epoch, self.source, v, _position(start), _position(end))
                for v, start, end in self.moves]

    def lifecycle(self) -> str:
        return "live" if self.done else "backfilling" if self.first else ""

    def to_json(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self.__dataclass_fields__})

    @classmethod
    def from_json(cls, text: str) -> TaskChunk:
        data = json.loads(text)
        data["moves"] = tuple(tuple(move) for move in data["moves"])
        return cls(**data)

    @staticmethod
    def moves_of(source_positions: Sequence[tuple[int, Position, Position]]) -> tuple[tuple[int, str, str], ...]:
        return tuple((v, position_text(start), position_text(end)) for v, start, end in source_positions)


@dataclass(frozen=True)
class CoveredRows:
    """``mapInArrow``'s function over the upstream's read: the rows of changes whose key the backfill's
    positions cover (and every barrier row); the others are dropped, the chunks bring those keys later.
    ``positions``: per vnode, b"" done, None not started, else the order member of its last key."""

    upstream: CatalogEntry
    positions: tuple[bytes | None, ...]

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        columns = self.upstream.key_columns
        for batch in batches:
            avro_keys = batch.column("_key").to_pylist()
            barrier = pc.equal(batch.column("_change_type"), BARRIER).to_pylist()
            keys = list(zip(*(batch.column(c).to_pylist() for c in columns), strict=True))
            keep = [True] * batch.num_rows
            partial = [i for i, key in enumerate(avro_keys) if not barrier[i] and self._partial(key, keep, i)]
            if partial:
                members = order_members([keys[i] for i in partial], [avro_keys[i] for i in partial])
                for i, member in zip(partial, members, strict=True):
                    last = self.positions[member[0]]
                    keep[i] = last is not None and member <= last
            yield batch.filter(pa.array(keep, pa.bool_()))

    def _partial(self, avro_key: bytes, keep: list[bool], i: int) -> bool:
        """Whether the row's vnode is part way; else settles ``keep[i]`` (done: kept, not started: dropped)."""
        last = self.positions[vnode_of(avro_key)]
        if last == b"" or last is None:
            keep[i] = last == b""
            return False
        return True


@dataclass(frozen=True)
class ChunkRows:
    """``mapInArrow``'s function over ``spark.range(tasks)``: task ``i`` reads rows ``i * ROWS_PER_TASK`` on
    of the saved chunk from Redis and yields them as the data source's signed rows of epoch ``epoch``
    (inserts, in their upstream partition; offsets below 0, which no change event has)."""

    settings_json: str
    view: str
    upstream: CatalogEntry
    epoch: int
    rows: int

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settings = Settings.from_executor_json(self.settings_json)
        store = BackfillStore(redis_client.task_client(settings), settings.topic_prefix)
        for batch in batches:
            for task in batch.column(0).to_pylist():
                yield from self._rows(store, task * ROWS_PER_TASK, min(self.rows, (task + 1) * ROWS_PER_TASK))

    def _rows(self, store: BackfillStore, start: int, stop: int) -> Iterator[pa.RecordBatch]:
        found = store.chunk_rows(self.view, start, stop)
        if len(found) != stop - start:
            raise RuntimeError(f"{self.view}: the saved backfill chunk of epoch {self.epoch} holds {len(found)} "
                               f"of its rows {start}..{stop}")
        builders: dict[int, SignedRowBuilder] = {}
        for n, (member, value) in enumerate(found, start):
            partition = partition_of_vnode(member[0], self.upstream.partitions)
            builder = builders.get(partition)
            if builder is None:
                builder = builders[partition] = SignedRowBuilder(self.upstream.schema, partition)
            builder.add_images(self.epoch, -1 - n, member_avro_key(member), None, decode_row(value))
        for builder in builders.values():
            yield builder.flush()


@dataclass(frozen=True)
class BackfillBatch:
    """A micro-batch of a view in tasks while its chunked backfill runs (see the module's docstring):
    its input built from each upstream's read, the mutation on each epoch's barriers, each epoch's commit.
    A join's two upstreams each have their positions; a micro-batch's chunk is of one of them."""

    settings_json: str
    view: str
    upstreams: Mapping[str, CatalogEntry]
    positions: Mapping[str, tuple[bytes | None, ...]]  # committed, per upstream and vnode (see CoveredRows)
    rows_done: int
    start_epoch: int
    upto: int  # the micro-batch's last epoch: the chunk's, if there is one
    chunk: TaskChunk | None
    chunk_keys: tuple[str, ...] = ()  # where the chunk is saved: dropped by its epoch's commit

    def frame(self, spark: SparkSession, source: str, read: DataFrame | None) -> DataFrame | None:
        """Upstream ``source``'s input to the view: the covered changes of ``read`` (its epochs of the
        micro-batch; None: none read), and the chunk's rows in its epoch if the chunk is of ``source``."""
        upstream = self.upstreams[source]
        covered = None if read is None else read.mapInArrow(CoveredRows(upstream, self.positions[source]).run,
                                                            read.schema)
        if self.chunk is None or self.chunk.rows == 0 or self.chunk.source != source:
            return covered
        tasks = -(-self.chunk.rows // ROWS_PER_TASK)
        rows = ChunkRows(self.settings_json, self.view, upstream, self.chunk.epoch, self.chunk.rows)
        schema = spark_schema_ddl(upstream.schema) if read is None else read.schema
        chunk = spark.range(0, tasks, 1, numPartitions=tasks).mapInArrow(rows.run, schema)
        return chunk if covered is None else covered.unionByName(chunk)

    def mutation(self, epoch: int) -> Mutation:
        """What the epoch's barriers carry (as the driver path's): the chunk's moves in its epoch, the
        counters in every other (so a reader knows the view covered only part of its upstream there)."""
        return Mutation(BACKFILL_MUTATION, self.view, progress_payload(self.commit(epoch).fields))

    def commit(self, epoch: int) -> BackfillCommit:
        """What the epoch commits to the backfill in Redis (the chunk's epoch drops the saved chunk)."""
        if self.chunk is not None and epoch == self.chunk.epoch:
            return BackfillCommit(self.chunk.fields(), self.chunk.journal(), self.chunk.lifecycle(), self.chunk_keys)
        return BackfillCommit({"rows_done": self.rows_done, "start_epoch": self.start_epoch})


def committed_positions(positions: Sequence[Position]) -> tuple[bytes | None, ...]:
    """Positions as :class:`CoveredRows` takes them, one per vnode."""
    assert len(positions) == VNODE_COUNT
    return tuple(b"" if p.done else p.last for p in positions)


@dataclass(frozen=True)
class CommittedAbove:
    """What a view's partitions committed above its MCE, as their barriers say: the last epoch any of
    them committed (the MCE when none did), and the chunk's epoch and ``backfill_progress`` payload if
    one of those epochs emitted a chunk (only a micro-batch's last epoch does, so one at most). Pure."""

    last: int
    chunk_epoch: int | None = None
    payload: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, view: str, after: int, barriers: Sequence[PartitionBarrier]) -> CommittedAbove:
        above = [b for b in barriers if b.epoch > after]
        chunks = {b.epoch: b.mutation.payload for b in above
                  if b.mutation is not None and b.mutation.kind == BACKFILL_MUTATION
                  and any(b.mutation.payload.get("positions", {}).values())}
        if len(chunks) > 1:
            raise BackfillError(f"{view}: epochs {sorted(chunks)} above the MCE {after} each emitted a chunk "
                                "in some partition; a micro-batch of the task path emits one, in its last epoch")
        last = max((b.epoch for b in above), default=after)
        if not chunks:
            return cls(last)
        (epoch, payload), = chunks.items()
        return cls(last, epoch, payload)


def recover_chunk(settings: Settings, store: ViewStore, entry: CatalogEntry, upstreams: Mapping[str, CatalogEntry],
                  after: int, positions: BackfillPositions, rows_done: int, first: bool
                  ) -> tuple[TaskChunk | None, int]:
    """With no saved chunk: the chunk of an epoch some partition of ``entry`` committed above ``after``
    (the saved copy lost to a Redis wipe), made again and saved; and the last epoch any partition
    committed above ``after``, which a new chunk must come after (their epochs had none). The chunk is
    of the upstream whose positions its barriers moved."""
    start = store.index.offsets_after(entry.name, entry.partitions, after or None)
    barriers = [barrier for found in barriers_above(settings, entry.name, entry.partitions, start).values()
                for barrier in found]
    above = CommittedAbove.of(entry.name, after, barriers)
    if above.chunk_epoch is None or above.payload is None:
        return None, above.last
    payload = above.payload
    source = next(name for name, moved in dict(payload["positions"]).items() if moved)
    upstream = upstreams[source]
    ends = {int(v): _position(str(text)) for v, text in dict(payload["positions"][source]).items()}
    moves = [(vnode, positions.get(source, vnode), end) for vnode, end in sorted(ends.items())]
    rows = _rows_between(settings, store, upstream, above.chunk_epoch, moves)
    if rows_done + len(rows) != int(payload.get("rows_done", -1)):
        raise BackfillError(f"{entry.name}: the chunk of epoch {above.chunk_epoch}, read again, has {len(rows)} "
                            f"row(s) after {rows_done}; its barriers say {payload.get('rows_done')} in all")
    chunk = TaskChunk(entry.name, source, above.chunk_epoch, len(rows), TaskChunk.moves_of(moves),
                      rows_done + len(rows), int(payload.get("start_epoch", 0)), bool(payload.get("done")), first)
    store.save_chunk(entry.name, chunk.to_json(), rows)
    return chunk, above.last


def _rows_between(settings: Settings, store: ViewStore, upstream: CatalogEntry, epoch: int,
                  moves: Sequence[tuple[int, Position, Position]]) -> list[tuple[bytes, bytes]]:
    """The upstream's rows at ``epoch`` in the key ranges ``moves`` covers (each: vnode, from after
    ``start`` to ``end``), as (order member, value), in key order: what the chunk read then."""
    ranges = {vnode: (start, end) for vnode, start, end in moves}
    found: list[tuple[bytes, bytes]] = []
    for key, row in rows_at_epoch(settings, store, upstream, epoch).items():
        avro_key = encode_key(upstream.key_columns, key)
        vnode = vnode_of(avro_key)
        if vnode in ranges:
            start, end = ranges[vnode]
            member = order_member(vnode, key, avro_key)
            if not start.covers(member) and end.covers(member):
                found.append((member, encode_row(row)))
    return sorted(found)
