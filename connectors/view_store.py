"""A view's serving state in Redis: rows, operator state, max committed epoch (MCE) and lifecycle.

Rows, operator state, the epoch index and the MCE change together in one Lua script per epoch, which
also refuses an epoch at or below the MCE: applying an epoch twice is impossible, whoever retries it.
All keys of a view share the hash tag ``{view}`` so the script also runs on Redis Cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

import redis

from mvlog.changes import Change
from mvlog.connectors.epoch_index import EpochIndex, IndexEntry, epoch_hex, index_member
from mvlog.schemas.codec import encode_key, encode_row


class Lifecycle(StrEnum):
    CREATING = "creating"
    BACKFILLING = "backfilling"
    REPLAYING = "replaying"
    LIVE = "live"
    PAUSED = "paused"
    FAILED = "failed"


_COMMIT_SCRIPT = """
local meta = KEYS[1]
local current = redis.call('HGET', meta, 'mce_hex')
if current and current >= ARGV[1] then
  return 0
end
if ARGV[8] ~= '' and (current or 'none') ~= ARGV[8] then
  return -1
end
-- ARGV[first .. first + count * width - 1] in calls of at most 512 items (Lua's stack is small).
local function each_chunk(command, key, first, count, width)
  local last = first + count * width - 1
  local i = first
  while i <= last do
    local j = math.min(i + 512 * width - 1, last)
    redis.call(command, key, unpack(ARGV, i, j))
    i = j + 1
  end
  return last + 1
end
local i = 9
i = each_chunk('HSET', KEYS[2], i, tonumber(ARGV[4]), 2)
i = each_chunk('HDEL', KEYS[2], i, tonumber(ARGV[5]), 1)
i = each_chunk('HSET', KEYS[3], i, tonumber(ARGV[6]), 2)
i = each_chunk('HDEL', KEYS[3], i, tonumber(ARGV[7]), 1)
for k = 4, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[i]); i = i + 1 end
redis.call('HSET', meta, 'mce_hex', ARGV[1], 'mce', ARGV[2], 'mce_ts_ms', ARGV[3])
return 1
"""


_REPLACE_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'mce_hex')
if current ~= ARGV[1] then
  redis.call('DEL', KEYS[4], KEYS[5])
  return 0
end
for i = 0, 1 do
  if redis.call('EXISTS', KEYS[4 + i]) == 1 then
    redis.call('RENAME', KEYS[4 + i], KEYS[2 + i])
  else
    redis.call('DEL', KEYS[2 + i])
  end
end
return 1
"""


@dataclass(frozen=True)
class EpochCommit:
    """What one epoch changes in a view's serving state."""

    epoch: int
    row_puts: Mapping[bytes, bytes]
    row_deletes: Sequence[bytes]
    index: Mapping[int, IndexEntry]  # partition -> barrier entry of this epoch
    state_puts: Mapping[bytes, bytes] | None = None
    state_deletes: Sequence[bytes] = ()
    # The MCE this epoch must follow (0: none yet); None skips the check. A writer that knows its last
    # committed epoch passes it, so a wiped (or rolled back) Redis is detected instead of overwritten.
    follows: int | None = None


class ServingStateLostError(RuntimeError):
    """Redis no longer holds the MCE an epoch follows: it was wiped (or rolled back); rebuild from Kafka."""


class ViewStore:
    """Redis serving state of all views under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self.index = EpochIndex(client, prefix)
        self._commit = client.register_script(_COMMIT_SCRIPT)
        self._replace = client.register_script(_REPLACE_SCRIPT)

    def _key(self, view: str, what: str) -> str:
        return f"{self.prefix}:{{{view}}}:{what}"

    # --- committed epochs -------------------------------------------------------------------------

    def commit(self, view: str, commit: EpochCommit) -> bool:
        """Apply one epoch atomically; False (and nothing changed) when it is at or below the MCE.

        Raises :class:`ServingStateLostError` (nothing changed) when ``commit.follows`` is not the MCE."""
        state_puts = commit.state_puts or {}
        partitions = sorted(commit.index)
        keys = [self._key(view, "meta"), self._key(view, "rows"), self._key(view, "opstate")]
        keys += [self.index.key(view, p) for p in partitions]
        args: list[bytes | str | int] = [
            epoch_hex(commit.epoch), commit.epoch, int(time.time() * 1000),
            len(commit.row_puts), len(commit.row_deletes), len(state_puts), len(commit.state_deletes),
            "" if commit.follows is None else (epoch_hex(commit.follows) if commit.follows > 0 else "none"),
        ]
        for field, value in commit.row_puts.items():
            args += [field, value]
        args += list(commit.row_deletes)
        for field, value in state_puts.items():
            args += [field, value]
        args += list(commit.state_deletes)
        args += [index_member(commit.epoch, commit.index[p].offset, commit.index[p].records) for p in partitions]
        result = int(self._commit(keys=keys, args=args))
        if result < 0:
            raise ServingStateLostError(f"{view}: epoch {commit.epoch} follows epoch {commit.follows}, but Redis "
                                        f"holds MCE {self.mce(view)}: the serving state was wiped or rolled back")
        return result == 1

    def mce(self, view: str) -> int | None:
        value = self.redis.hget(self._key(view, "meta"), "mce")
        return int(value) if value is not None else None

    def mce_many(self, views: Sequence[str]) -> dict[str, int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for view in views:
            pipe.hget(self._key(view, "meta"), "mce")
        return {v: (int(m) if m is not None else None) for v, m in zip(views, pipe.execute(), strict=True)}

    # --- lifecycle --------------------------------------------------------------------------------

    def set_lifecycle(self, view: str, state: Lifecycle, reason: str = "") -> None:
        self.redis.hset(self._key(view, "meta"), mapping={"state": state.value, "reason": reason,
                                                          "state_ts_ms": int(time.time() * 1000)})

    def lifecycle(self, view: str) -> Lifecycle | None:
        value = cast(bytes | None, self.redis.hget(self._key(view, "meta"), "state"))
        return Lifecycle(value.decode()) if value is not None else None

    def meta(self, view: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self._key(view, "meta")))
        return {k.decode(): v.decode() for k, v in raw.items()}

    # --- rows and operator state ------------------------------------------------------------------

    def get_rows(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "rows"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def scan_rows(self, view: str, batch: int = 1000) -> Iterator[tuple[bytes, bytes]]:
        """All rows, a batch at a time (HSCAN: memory stays bounded for large views)."""
        yield from self.redis.hscan_iter(self._key(view, "rows"), count=batch)

    def row_count(self, view: str) -> int:
        return int(self.redis.hlen(self._key(view, "rows")))

    def get_state(self, view: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        values = cast(list[bytes | None], self.redis.hmget(self._key(view, "opstate"), list(keys)))
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def read_at_consistent_epoch(self, view: str) -> tuple[int | None, list[tuple[bytes, bytes]]]:
        """All rows together with the MCE they reflect (one MULTI, so both are of the same epoch)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hgetall(self._key(view, "rows"))
        mce, rows = pipe.execute()
        return (int(mce) if mce is not None else None), list(rows.items())

    def get_rows_at_consistent_epoch(self, view: str, keys: Sequence[bytes]
                                     ) -> tuple[int | None, dict[bytes, bytes]]:
        """The rows of ``keys`` (those that exist) with the MCE they reflect (one MULTI)."""
        if not keys:
            return self.mce(view), {}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self._key(view, "meta"), "mce")
        pipe.hmget(self._key(view, "rows"), list(keys))
        mce, values = pipe.execute()
        rows = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        return (int(mce) if mce is not None else None), rows

    def replace_state(self, view: str, expected_mce: int, rows: Mapping[bytes, bytes],
                      state: Mapping[bytes, bytes], chunk: int = 1000) -> bool:
        """Replace the view's rows and operator state with ones rebuilt for epoch ``expected_mce``.

        They are staged under temporary keys and swapped in by one script that checks the MCE is still
        ``expected_mce``; False (and nothing changed) when it moved (a consumer committed meanwhile).
        """
        staged = [self._key(view, "rows.rebuild"), self._key(view, "opstate.rebuild")]
        self.redis.delete(*staged)
        for key, mapping in zip(staged, (rows, state), strict=True):
            items = list(mapping.items())
            for start in range(0, len(items), chunk):
                self.redis.hset(key, mapping=dict(items[start:start + chunk]))
        keys = [self._key(view, "meta"), self._key(view, "rows"), self._key(view, "opstate"), *staged]
        return bool(self._replace(keys=keys, args=[epoch_hex(expected_mce)]))

    def drop(self, view: str, partitions: int) -> None:
        keys = [self._key(view, w) for w in ("meta", "rows", "opstate")]
        keys += [self.index.key(view, p) for p in range(partitions)]
        self.redis.delete(*keys)


def commit_from_changes(key_columns: Sequence[str], epoch: int, changes: Sequence[Change],
                        index: Mapping[int, IndexEntry]) -> EpochCommit:
    """The serving-state update of an epoch whose changes are ``changes`` (last change of a key wins)."""
    columns = tuple(key_columns)
    puts: dict[bytes, bytes] = {}
    deletes: dict[bytes, None] = {}
    for change in changes:
        key = encode_key(columns, change.key)
        if change.after is None:
            puts.pop(key, None)
            deletes[key] = None
        else:
            deletes.pop(key, None)
            puts[key] = encode_row(change.after)
    return EpochCommit(epoch, puts, list(deletes), index)
