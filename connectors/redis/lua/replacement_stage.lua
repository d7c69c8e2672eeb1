local status = redis.call('HGET', KEYS[1], 'status')
if status == 'staged' then return redis.call('HGET', KEYS[1], 'id') end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'sql', ARGV[2], 'status', 'staged', 'staged_ts_ms', ARGV[3])
return false
