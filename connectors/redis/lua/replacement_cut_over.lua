-- A replacement's cut-over computed by Spark's tasks, a view partition each (services/replacement/
-- cut_over.py): the replacement's rows and operator state become the view's, every partition's staged
-- part of the diff is applied over them (its rows are the replacement's already; its key-order members
-- are what the view's key-order index gains and loses), with the epoch index, the MCE and the record,
-- at once.
-- KEYS: record, rows, opstate, view meta, view rows, view opstate, view key-order index, then per
-- partition its six staged keys, then the epoch index of each partition.
-- ARGV: id, epoch hex, epoch, now (ms), version, partitions, then per partition the six staged counts,
-- then an index member per partition.
-- 1: applied; 0: the view is at or past the epoch; -2: something staged is missing; -3: not staged
-- under that id, or its cut-over is not fixed at this epoch. Nothing is applied unless 1.
local record = KEYS[1]
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged'
   or redis.call('HGET', record, 'cut_epoch') ~= ARGV[3] then
  return -3
end
local current = redis.call('HGET', KEYS[4], 'mce_hex')
if current and current >= ARGV[2] then return 0 end
local n = tonumber(ARGV[6])
if not staged_whole(8, n, 7) then return -2 end
swap_staged(2, 5, 2)  -- the replacement's rows and opstate become the view's
for p = 0, n - 1 do
  apply_staged(8 + 6 * p, KEYS[5], KEYS[7], KEYS[6])
end
for p = 0, n - 1 do
  redis.call('ZADD', KEYS[8 + 6 * n + p], 0, ARGV[7 + 6 * n + p])
end
mark_applied(1, 4)
return 1
