if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged' then
  redis.call('DEL', KEYS[4], KEYS[5])
  return 0
end
local current = redis.call('HGET', KEYS[1], 'mce_hex')
if current and current >= ARGV[2] then
  redis.call('DEL', KEYS[4], KEYS[5])
  return 0
end
swap_staged(4, 2, 2)
redis.call('HSET', KEYS[1], 'mce_hex', ARGV[2], 'mce', ARGV[3], 'mce_ts_ms', ARGV[4])
if #ARGV > 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 5, #ARGV)) end
return 1
