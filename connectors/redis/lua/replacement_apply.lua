local record = KEYS[1]
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged'
   or not redis.call('HGET', record, 'apply_requested') then
  return 0
end
local mine = redis.call('HGET', record, 'mce_hex')
if not mine or mine < ARGV[2] then return 0 end
local current = redis.call('HGET', KEYS[4], 'mce_hex')
if current and current >= ARGV[2] then return 0 end
for k = 2, 3 do
  if redis.call('EXISTS', KEYS[k]) == 1 then
    redis.call('RENAME', KEYS[k], KEYS[k + 3])
  else
    redis.call('DEL', KEYS[k + 3])
  end
end
for k = 8, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[k - 2]) end
local i = #KEYS - 1
local added, removed = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
i = i + 2
for j = i, i + added - 1 do redis.call('ZADD', KEYS[7], 0, ARGV[j]) end
for j = i + added, i + added + removed - 1 do redis.call('ZREM', KEYS[7], ARGV[j]) end
redis.call('HSET', KEYS[4], 'mce_hex', ARGV[2], 'mce', ARGV[3], 'mce_ts_ms', ARGV[4])
redis.call('HDEL', record, 'apply_requested', 'mce', 'mce_hex', 'mce_ts_ms')
redis.call('HSET', record, 'status', 'applied', 'applied_epoch', ARGV[3], 'applied_version', ARGV[5],
           'applied_ts_ms', ARGV[4])
return 1
