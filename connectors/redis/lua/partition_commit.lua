-- One epoch of a view whose partitions were computed by separate tasks: every partition's staged rows,
-- key-order members and operator state swapped in, the epoch index and the MCE, at once.
-- With a chunked backfill run by the tasks, also its positions, counters and journal lines, the view's
-- lifecycle, and the backfill's chunk record dropped (committed now: see services/backfill/task_chunks.py).
-- KEYS: meta, rows, keyorder, opstate, then per partition its staged puts (hash), deletes (set), order
-- puts (set), order deletes (set), state puts (hash), state deletes (set), then the epoch index of each
-- partition, then the backfill hash and the journal list, then keys to delete.
-- ARGV: epoch hex, epoch, now (ms), the MCE it follows ('none': no MCE; '': unchecked), partitions,
-- then per partition the six staged counts, then an index member per partition, then the number of
-- backfill fields, of journal lines, the lifecycle ('' keeps it), the field/value pairs, the lines.
-- 1: applied; 0: at or below the MCE; -1: the MCE is not the one it follows; -2: something staged is
-- missing (nothing applied).
local meta = KEYS[1]
local refused = refuse_epoch(meta, ARGV[1], ARGV[4])
if refused then
  return refused
end
local n = tonumber(ARGV[5])
local width = 6
if not staged_whole(5, n, 6) then
  return -2
end
for p = 0, n - 1 do
  apply_staged(5 + width * p, KEYS[2], KEYS[3], KEYS[4])
end
local first_index = 5 + width * n
for p = 0, n - 1 do
  redis.call('ZADD', KEYS[first_index + p], 0, ARGV[6 + width * n + p])
end
local a = 6 + width * n + n
local fields, lines, lifecycle = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2]
local backfill, journal = KEYS[first_index + n], KEYS[first_index + n + 1]
a = a + 3
if fields > 0 then
  redis.call('HSET', backfill, unpack(ARGV, a, a + 2 * fields - 1))
  a = a + 2 * fields
end
if lines > 0 then
  redis.call('RPUSH', journal, unpack(ARGV, a, a + lines - 1))
  redis.call('LTRIM', journal, -JOURNAL_LIMIT, -1)
end
for k = first_index + n + 2, #KEYS do redis.call('DEL', KEYS[k]) end
redis.call('HSET', meta, 'mce_hex', ARGV[1], 'mce', ARGV[2], 'mce_ts_ms', ARGV[3])
if lifecycle ~= '' then
  redis.call('HSET', meta, 'state', lifecycle, 'reason', '', 'state_ts_ms', ARGV[3])
end
return 1
