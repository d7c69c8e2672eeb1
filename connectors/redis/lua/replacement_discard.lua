if redis.call('HGET', KEYS[1], 'status') ~= 'staged' then return false end
local id = redis.call('HGET', KEYS[1], 'id')
redis.call('DEL', unpack(KEYS, 2))
redis.call('HDEL', KEYS[1], 'apply_requested', 'mce', 'mce_hex', 'mce_ts_ms', 'error', 'hydration_epoch',
           'hydrated_from')
redis.call('HSET', KEYS[1], 'status', 'discarded', 'discarded_ts_ms', ARGV[1])
return id
