if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged' then
  return 0
end
local current = redis.call('HGET', KEYS[1], 'mce_hex')
if current and current >= ARGV[2] then return 0 end
local i = 9
i = each_chunk('HSET', KEYS[2], i, tonumber(ARGV[5]), 2)
i = each_chunk('HDEL', KEYS[2], i, tonumber(ARGV[6]), 1)
i = each_chunk('HSET', KEYS[3], i, tonumber(ARGV[7]), 2)
i = each_chunk('HDEL', KEYS[3], i, tonumber(ARGV[8]), 1)
redis.call('HSET', KEYS[1], 'mce_hex', ARGV[2], 'mce', ARGV[3], 'mce_ts_ms', ARGV[4])
if i <= #ARGV then redis.call('HSET', KEYS[1], unpack(ARGV, i, #ARGV)) end
return 1
