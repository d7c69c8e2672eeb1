-- One epoch of a staged replacement computed by Spark's tasks, a view partition each: every partition's
-- staged rows and operator state applied to the replacement's, and its MCE, at once.
-- KEYS: the replacement's record, rows, opstate, then per partition its six staged keys.
-- ARGV: id, epoch hex, epoch, now (ms), partitions, then per partition the six staged counts.
-- 1: applied; 0: at or below the replacement's MCE; -2: something staged is missing; -3: the replacement
-- is no longer staged under that id. Nothing is applied unless 1; the staged keys are dropped but on -2.
local n = tonumber(ARGV[5])
local function drop_staged()
  for k = 4, 3 + 6 * n do redis.call('DEL', KEYS[k]) end
end
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged' then
  drop_staged()
  return -3
end
local current = redis.call('HGET', KEYS[1], 'mce_hex')
if current and current >= ARGV[2] then
  drop_staged()
  return 0
end
if not staged_whole(4, n, 6) then
  return -2
end
for p = 0, n - 1 do
  apply_staged(4 + 6 * p, KEYS[2], nil, KEYS[3])
end
redis.call('HSET', KEYS[1], 'mce_hex', ARGV[2], 'mce', ARGV[3], 'mce_ts_ms', ARGV[4])
return 1
