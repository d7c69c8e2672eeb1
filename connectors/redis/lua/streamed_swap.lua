local current = redis.call('HGET', KEYS[1], 'mce_hex')
local result = 1
if current and current >= ARGV[1] then
  result = 0
elseif (current or 'none') ~= ARGV[4] then
  result = -1
elseif redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 or redis.call('HLEN', KEYS[4]) ~= tonumber(ARGV[5])
    or redis.call('ZCARD', KEYS[5]) ~= tonumber(ARGV[6]) then
  result = -2
end
if result ~= 1 then
  redis.call('DEL', KEYS[4], KEYS[5])
  return result
end
for k = 2, 3 do
  if redis.call('EXISTS', KEYS[k + 2]) == 1 then
    redis.call('RENAME', KEYS[k + 2], KEYS[k])
    redis.call('PERSIST', KEYS[k])
  end
end
for k = 6, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[k + 1]) end
redis.call('HSET', KEYS[1], 'mce_hex', ARGV[1], 'mce', ARGV[2], 'mce_ts_ms', ARGV[3])
return 1
