"""A staged replacement's state in Redis, next to its view's (same hash tag ``{view}``).

Keys (``P`` = topic prefix, ``V`` = view):

- ``P:{V}:replacement``: hash, the replacement's record: ``id``, ``sql``, ``status`` (staged, applied,
  discarded), ``staged_ts_ms``; once hydrated ``mce`` (the upstream epoch its rows reflect),
  ``mce_hex``, ``mce_ts_ms``, and where hydration started: ``hydration_epoch`` (the epoch of its
  first commit: an upstream snapshot's, or the view's MCE when it replayed the whole changelog) and
  ``hydrated_from`` (which snapshot or changelog each upstream came from); ``apply_requested`` (ms)
  while an apply waits; ``cut_epoch`` once a cut-over in Spark's tasks began at that epoch (the apply
  can then only complete: :meth:`ReplacementStore.begin_cut_over`); after the cut-over
  ``applied_epoch``, ``applied_version``, ``applied_ts_ms``; after a discard ``discarded_ts_ms``;
  ``error`` when its consumer had to stop maintaining it (it stays staged until discarded).
- ``P:{V}:replacement:rows`` and ``P:{V}:replacement:opstate``: its rows and operator state, encoded
  like the view's own (``P:{V}:rows``, ``P:{V}:opstate``).
- ``P:{V}:replacement:rows.hydrate`` and ``P:{V}:replacement:opstate.hydrate``: its first state while
  Spark's tasks stage it, one view partition each (:meth:`ReplacementStore.stage_hydration`), until
  :meth:`ReplacementStore.swap_hydration` makes it the replacement's.
- ``P:{V}:replacement:pstage:<epoch hex>:<partition>:<what>``: an epoch it follows in Spark's tasks, as
  each view partition's task staged it (:data:`~mvlog.connectors.redis.partition_staging.REPLACEMENT_SCOPE`),
  until :meth:`ReplacementStore.commit_partitions` applies them all with its MCE.

Every write is a Lua script that first checks the record's ``id`` and ``status``, so a discarded or
replaced replacement is never written by a consumer that has not noticed yet. The cut-over
(:meth:`ReplacementStore.apply`) moves the replacement's rows and state into the view's keys and
commits the view's MCE and epoch index in the same script: the view's serving state jumps from the
old definition to the new one at exactly one epoch, or not at all. Where Spark's tasks compute the
cut-over (:mod:`mvlog.services.replacement.cut_over`), :meth:`ReplacementStore.apply_partitions` does the
same with the key-order members each view partition's task staged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis

from mvlog.changes import IndexEntry
from mvlog.connectors.redis.chunked_writes import CHUNK, hset_chunked
from mvlog.connectors.redis.epoch_index import EpochIndex, epoch_hex, index_member
from mvlog.connectors.redis.lua_scripts import lua_script
from mvlog.connectors.redis.packed_script import run_script
from mvlog.connectors.redis.partition_staging import (
    REPLACEMENT_SCOPE,
    PartitionStaging,
    StagedCounts,
    StagingIncompleteError,
)
from mvlog.connectors.redis.redis_keys import view_key
from mvlog.replacement import ReplacementError, Status

_STAGE_SCRIPT = lua_script("replacement_stage")

# KEYS: record, rows, opstate. ARGV: id, epoch hex, epoch, ts, #row puts, #row deletes, #state puts,
# #state deletes, then the items, then record fields to set with the commit (name, value pairs).
_COMMIT_SCRIPT = lua_script("replacement_commit", lib=["each_chunk"])

# KEYS: record, rows, opstate, then each partition's six staged keys. ARGV: id, epoch hex, epoch, ts,
# partitions, then each partition's six staged counts.
_PARTITION_COMMIT_SCRIPT = lua_script("replacement_partition_commit", lib=["apply_staged"])

_REQUEST_APPLY_SCRIPT = lua_script("replacement_request_apply")

_WITHDRAW_SCRIPT = lua_script("replacement_withdraw")

_FAIL_SCRIPT = lua_script("replacement_fail")

_DISCARD_SCRIPT = lua_script("replacement_discard")

# KEYS: record, rows, opstate, staged rows, staged opstate. ARGV: id, epoch hex, epoch, ts, then record
# fields to set (name, value pairs).
_HYDRATE_SCRIPT = lua_script("replacement_hydrate", lib=["swap_staged"])

# KEYS: record, rows, opstate, view meta, view rows, view opstate, view key-order index, index keys...
# ARGV: id, epoch hex, epoch, ts, version, one index member per index key, then the counts of key-order
# members added and removed (the diff's inserts and deletes) and those members.
_APPLY_SCRIPT = lua_script("replacement_apply", lib=["swap_staged", "mark_applied"])

_CUT_SCRIPT = lua_script("replacement_cut")

# KEYS: record, rows, opstate, view meta, view rows, view opstate, view key-order index, then each
# partition's six staged keys, then each partition's index key. ARGV: id, epoch hex, epoch, ts, version,
# partitions, each partition's six staged counts, then an index member per partition.
_CUT_OVER_SCRIPT = lua_script("replacement_cut_over", lib=["apply_staged", "swap_staged", "mark_applied"])


class ReplacementGoneError(RuntimeError):
    """The replacement a consumer maintains was discarded (or replaced by another) meanwhile."""


class CutOverBegunError(ReplacementError):
    """The replacement's cut-over began in Spark's tasks at :attr:`epoch`: some view partitions may hold it
    in Kafka already, so its apply can be neither withdrawn nor discarded; the view's consumer completes it."""

    def __init__(self, view: str, epoch: int) -> None:
        super().__init__(f"{view}: the replacement's cut-over began at epoch {epoch} in Spark's tasks; it can no "
                         "longer be withdrawn or discarded, and completes when the view's consumer runs")
        self.epoch = epoch


class CutOverNotReachedError(ReplacementError):
    """A cut-over in Spark's tasks at :attr:`epoch` while the replacement is at another epoch: its rows are
    not the cut-over's, so a diff of them would write wrong changes. The replacement must follow to the epoch
    first (:meth:`~mvlog.services.replacement.stage.ReplacementStage.cut_over_in_tasks` does). Raised rather
    than refused: a refusal reads as a withdrawn apply, which the next micro-batch would try again, forever."""

    def __init__(self, view: str, replacement_id: str, epoch: int, at: int | None) -> None:
        super().__init__(f"{view}: replacement {replacement_id} is at epoch {at}, not at its cut-over's epoch "
                         f"{epoch}; it must be there before Spark's tasks diff its rows")
        self.epoch = epoch


def _refused(view: str, error: redis.ResponseError) -> CutOverBegunError | None:
    """The :class:`CutOverBegunError` a script's ``CUTOVER <epoch>`` error reply stands for, if it is one."""
    words = str(error).split()
    return CutOverBegunError(view, int(words[1])) if len(words) == 2 and words[0] == "CUTOVER" else None


@dataclass(frozen=True)
class ReplacementRecord:
    """The replacement's record as stored (see the module docstring)."""

    view: str
    id: str
    sql: str
    status: Status
    mce: int | None = None  # None: not hydrated yet
    apply_requested: bool = False
    applied_epoch: int | None = None
    applied_version: int | None = None
    fields: Mapping[str, str] | None = None  # every stored field, for listings

    @property
    def hydrated(self) -> bool:
        return self.mce is not None

    @property
    def cut_epoch(self) -> int | None:
        """The epoch a cut-over in Spark's tasks began at (None: none began)."""
        value = (self.fields or {}).get("cut_epoch")
        return int(value) if value is not None else None

    @property
    def hydration_epoch(self) -> int | None:
        """The epoch hydration computed the replacement's first state at (None: not hydrated yet)."""
        value = (self.fields or {}).get("hydration_epoch")
        return int(value) if value is not None else None


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReplacementStore:
    """Redis state of the replacements of all views under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self.index = EpochIndex(client, prefix)
        self._stage = client.register_script(_STAGE_SCRIPT)
        self._commit = client.register_script(_COMMIT_SCRIPT)
        self._request = client.register_script(_REQUEST_APPLY_SCRIPT)
        self._withdraw = client.register_script(_WITHDRAW_SCRIPT)
        self._fail = client.register_script(_FAIL_SCRIPT)
        self._discard = client.register_script(_DISCARD_SCRIPT)
        self._apply = client.register_script(_APPLY_SCRIPT)
        self._cut = client.register_script(_CUT_SCRIPT)
        self._cut_over = client.register_script(_CUT_OVER_SCRIPT)
        self._hydrate = client.register_script(_HYDRATE_SCRIPT)
        self._partition_commit = client.register_script(_PARTITION_COMMIT_SCRIPT)
        #: Where Spark's tasks stage the epochs a replacement follows there (:meth:`commit_partitions`).
        self.staging = PartitionStaging(client, prefix, REPLACEMENT_SCOPE)

    def key(self, view: str, what: str = "") -> str:
        return view_key(self.prefix, view, "replacement" + (f":{what}" if what else ""))

    def _view_key(self, view: str, what: str) -> str:
        return view_key(self.prefix, view, what)  # ViewStore's keys

    def _keys(self, view: str) -> list[str]:
        return [self.key(view), self.key(view, "rows"), self.key(view, "opstate")]

    def _hydration_keys(self, view: str) -> list[str]:
        return [self.key(view, "rows.hydrate"), self.key(view, "opstate.hydrate")]

    # --- the record ------------------------------------------------------------------------------

    def stage(self, view: str, replacement_id: str, sql: str) -> str | None:
        """Record a new staged replacement; returns the id of one already staged instead (nothing done)."""
        existing = self._stage(keys=self._keys(view), args=[replacement_id, sql, _now_ms()])
        return existing.decode() if isinstance(existing, bytes) else None

    def record(self, view: str) -> ReplacementRecord | None:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.key(view)))
        if not raw or b"id" not in raw:
            return None
        fields = {k.decode(): v.decode() for k, v in raw.items()}

        def number(name: str) -> int | None:
            return int(fields[name]) if name in fields else None

        return ReplacementRecord(view, fields["id"], fields.get("sql", ""), Status(fields["status"]),
                                 number("mce"), "apply_requested" in fields, number("applied_epoch"),
                                 number("applied_version"), fields)

    def request_apply(self, view: str, replacement_id: str) -> bool:
        return bool(self._request(keys=[self.key(view)], args=[replacement_id, _now_ms()]))

    def withdraw_apply(self, view: str, replacement_id: str) -> bool:
        """Cancel a pending apply; False when it is no longer pending (applied or discarded meanwhile).
        Raises :class:`CutOverBegunError` when its cut-over began in Spark's tasks."""
        try:
            return bool(self._withdraw(keys=[self.key(view)], args=[replacement_id]))
        except redis.ResponseError as error:
            raise _refused(view, error) or error from None

    def fail(self, view: str, replacement_id: str, reason: str) -> bool:
        """Mark the staged replacement as stopped by an error (its consumer no longer maintains it)."""
        return bool(self._fail(keys=[self.key(view)], args=[replacement_id, reason]))

    def discard(self, view: str) -> str | None:
        """Drop the staged replacement's state; returns its id (None: nothing was staged). Raises
        :class:`CutOverBegunError` when its cut-over began in Spark's tasks."""
        try:
            result = self._discard(keys=self._keys(view) + self._hydration_keys(view), args=[_now_ms()])
        except redis.ResponseError as error:
            raise _refused(view, error) or error from None
        return result.decode() if isinstance(result, bytes) else None

    def forget(self, view: str) -> None:
        """Delete every key of the view's replacement (the view is dropped)."""
        self.redis.delete(*self._keys(view), *self._hydration_keys(view))

    # --- the hydrating replacement's state ---------------------------------------------------------

    def commit(self, view: str, replacement_id: str, epoch: int, row_puts: Mapping[bytes, bytes],
               row_deletes: Sequence[bytes], state_puts: Mapping[bytes, bytes],
               state_deletes: Sequence[bytes], fields: Mapping[str, str | int] | None = None) -> bool:
        """The replacement's rows and state at ``epoch`` (and record ``fields``), atomically; False
        (nothing changed) when the replacement is no longer staged under ``replacement_id`` or is
        already at ``epoch``."""
        args: list[bytes | str | int] = [replacement_id, epoch_hex(epoch), epoch, _now_ms(), len(row_puts),
                                         len(row_deletes), len(state_puts), len(state_deletes)]
        for field, value in row_puts.items():
            args += [field, value]
        args += list(row_deletes)
        for field, value in state_puts.items():
            args += [field, value]
        args += list(state_deletes)
        for name, setting in (fields or {}).items():
            args += [name, str(setting)]
        return bool(self._commit(keys=self._keys(view), args=args))

    def commit_partitions(self, view: str, replacement_id: str, epoch: int, staged: Mapping[int, StagedCounts]
                          ) -> bool:
        """The replacement's rows and state at ``epoch``, from what each view partition's task staged for it
        (:attr:`staging`, counts ``staged``), in one script. False (nothing changed) when the replacement is
        already at ``epoch``; raises :class:`ReplacementGoneError` when it is no longer staged under
        ``replacement_id``, :class:`~mvlog.connectors.redis.partition_staging.StagingIncompleteError` when
        a partition's staging is not whole."""
        partitions = sorted(staged)
        keys = self._keys(view)
        args: list[str | int] = [replacement_id, epoch_hex(epoch), epoch, _now_ms(), len(partitions)]
        for p in partitions:
            keys += self.staging.staged_keys(view, epoch, p)
            args += staged[p].as_list()
        result = int(run_script(self.redis, self._partition_commit, keys, args))
        if result == -3:
            raise ReplacementGoneError(f"{view}: replacement {replacement_id} is no longer staged")
        if result == -2:
            raise StagingIncompleteError(f"{view}: replacement {replacement_id}, epoch {epoch}: a partition's "
                                         "staged rows are missing in Redis")
        return result == 1

    def clear_hydration(self, view: str) -> None:
        """Drop what an earlier hydration in tasks left staged (before one starts staging)."""
        self.redis.delete(*self._hydration_keys(view))

    def stage_hydration(self, view: str, rows: Mapping[bytes, bytes], state: Mapping[bytes, bytes],
                        chunk: int = CHUNK) -> None:
        """Add rows and operator state to the staged first state of the replacement. Spark's tasks stage
        disjoint parts (a view partition each), and a retried task stages the same values again."""
        for key, mapping in zip(self._hydration_keys(view), (rows, state), strict=True):
            hset_chunked(self.redis, key, mapping, chunk)

    def swap_hydration(self, view: str, replacement_id: str, epoch: int,
                       fields: Mapping[str, str | int] | None = None) -> bool:
        """Make the staged first state the replacement's, at ``epoch``, and record ``fields``, in one
        script; False (the staging dropped, nothing else changed) when the replacement is no longer
        staged under ``replacement_id`` or is already at ``epoch`` or later."""
        args: list[str | int] = [replacement_id, epoch_hex(epoch), epoch, _now_ms()]
        for name, setting in (fields or {}).items():
            args += [name, str(setting)]
        return bool(self._hydrate(keys=self._keys(view) + self._hydration_keys(view), args=args))

    def rows(self, view: str) -> dict[bytes, bytes]:
        return cast(dict[bytes, bytes], self.redis.hgetall(self.key(view, "rows")))

    def scan_rows(self, view: str, batch: int = 1000) -> Iterator[tuple[bytes, bytes]]:
        yield from self.redis.hscan_iter(self.key(view, "rows"), count=batch)

    def get_state(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self.key(view, "opstate"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def read_both(self, view: str) -> tuple[int | None, dict[bytes, bytes], int | None, dict[bytes, bytes]]:
        """(view MCE, view rows, replacement MCE, replacement rows) read in one MULTI."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._view_key(view, "meta"), "mce")
        pipe.hgetall(self._view_key(view, "rows"))
        pipe.hget(self.key(view), "mce")
        pipe.hgetall(self.key(view, "rows"))
        view_mce, view_rows, mce, rows = pipe.execute()
        return (int(view_mce) if view_mce is not None else None, view_rows,
                int(mce) if mce is not None else None, rows)

    # --- the cut-over ------------------------------------------------------------------------------

    def apply(self, view: str, replacement_id: str, epoch: int, index: Mapping[int, IndexEntry],
              version: int, order_added: Sequence[bytes] = (), order_removed: Sequence[bytes] = ()) -> bool:
        """Make the replacement's rows and state the view's at ``epoch`` and commit the view's epoch,
        in one script; False (nothing changed) when the replacement was discarded, its apply withdrawn,
        it has not reached ``epoch``, or the view is already at ``epoch``."""
        partitions = sorted(index)
        keys = self._keys(view) + [self._view_key(view, w) for w in ("meta", "rows", "opstate", "keyorder")]
        keys += [self.index.key(view, p) for p in partitions]
        args: list[str | int | bytes] = [replacement_id, epoch_hex(epoch), epoch, _now_ms(), version]
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        args += [len(order_added), len(order_removed), *order_added, *order_removed]
        return bool(self._apply(keys=keys, args=args))

    def begin_cut_over(self, view: str, replacement_id: str, epoch: int) -> bool:
        """Fix the pending apply's cut-over at ``epoch`` before Spark's tasks write any of it (or find it
        fixed there by an earlier attempt): from then on it can only complete. False (nothing fixed) when
        the replacement is not staged under ``replacement_id`` or no apply is pending; raises
        :class:`CutOverBegunError` when a cut-over began at another epoch, and :class:`CutOverNotReachedError`
        when the replacement is not at ``epoch`` (the caller follows it there first)."""
        return self._fix_cut_over(view, replacement_id, epoch, found_in_log=False)

    def resume_cut_over(self, view: str, replacement_id: str, epoch: int) -> bool:
        """Fix the cut-over at ``epoch``, its apply pending, where the view's changelog holds it in some
        partitions but the record does not (Redis lost the record between the partitions' commits and the
        cut-over's Redis commit, and it was staged again from the catalog). The replacement need not be at
        ``epoch``: it follows there before the cut-over completes. False when the replacement is not staged
        under ``replacement_id``; raises :class:`CutOverBegunError` when a cut-over began at another epoch."""
        return self._fix_cut_over(view, replacement_id, epoch, found_in_log=True)

    def _fix_cut_over(self, view: str, replacement_id: str, epoch: int, *, found_in_log: bool) -> bool:
        result = int(self._cut(keys=[self.key(view)],
                               args=[replacement_id, epoch_hex(epoch), epoch, int(found_in_log), _now_ms()]))
        if result == -1:
            record = self.record(view)
            raise CutOverBegunError(view, record.cut_epoch if record is not None and record.cut_epoch else epoch)
        if result == -2:
            record = self.record(view)
            raise CutOverNotReachedError(view, replacement_id, epoch, record.mce if record is not None else None)
        return result == 1

    def apply_partitions(self, view: str, replacement_id: str, epoch: int, staged: Mapping[int, StagedCounts],
                         index: Mapping[int, IndexEntry], version: int) -> bool:
        """The cut-over :meth:`begin_cut_over` fixed at ``epoch``, from what each view partition's task staged
        for it (the view's own staging, counts ``staged``): the replacement's rows and state made the view's,
        the staged key-order members applied, the epoch index, the MCE and the record, in one script. False
        (nothing changed) when the view is at ``epoch`` already or the cut-over applied; raises
        :class:`ReplacementGoneError` when the replacement is no longer staged with its cut-over at
        ``epoch``, :class:`StagingIncompleteError` when a partition's staging is not whole."""
        partitions = sorted(index)
        if sorted(staged) != partitions:
            raise ValueError(f"{view}: cut-over at {epoch} staged partitions {sorted(staged)}, indexed {partitions}")
        view_staging = PartitionStaging(self.redis, self.prefix)
        keys = self._keys(view) + [self._view_key(view, w) for w in ("meta", "rows", "opstate", "keyorder")]
        args: list[str | int | bytes] = [replacement_id, epoch_hex(epoch), epoch, _now_ms(), version, len(partitions)]
        for p in partitions:
            keys += view_staging.staged_keys(view, epoch, p)
            args += staged[p].as_list()
        keys += [self.index.key(view, p) for p in partitions]
        args += [index_member(epoch, index[p].offset, index[p].records) for p in partitions]
        result = int(run_script(self.redis, self._cut_over, keys, args))
        if result == -3 and self._applied_at(view, replacement_id, epoch):
            return False  # applied by this call's retry after a lost reply, or by an earlier attempt
        if result == -3:
            raise ReplacementGoneError(f"{view}: replacement {replacement_id} is no longer staged to cut over at "
                                       f"epoch {epoch}")
        if result == -2:
            raise StagingIncompleteError(f"{view}: cut-over at epoch {epoch}: a partition's staged rows are missing "
                                         "in Redis")
        return result == 1

    def _applied_at(self, view: str, replacement_id: str, epoch: int) -> bool:
        record = self.record(view)
        return (record is not None and record.id == replacement_id and record.status is Status.APPLIED
                and record.applied_epoch == epoch)
