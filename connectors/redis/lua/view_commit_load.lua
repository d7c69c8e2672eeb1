if redis.call('HEXISTS', KEYS[1], 'mce_hex') == 1 then
  return 0
end
if redis.call('HLEN', KEYS[5]) ~= tonumber(ARGV[5]) or redis.call('ZCARD', KEYS[7]) ~= tonumber(ARGV[5]) then
  return -1
end
swap_staged(5, 2, 3)
for k = 8, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[k - 2]) end
redis.call('HSET', KEYS[1], 'mce_hex', ARGV[1], 'mce', ARGV[2], 'mce_ts_ms', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'reason', '', 'state_ts_ms', ARGV[3])
end
return 1
