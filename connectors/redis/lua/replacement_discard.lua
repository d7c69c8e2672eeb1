-- The staged replacement's id, its keys dropped; false when none is staged; an error reply when its
-- cut-over began in Spark's tasks (replacement_cut.lua): it can only complete.
if redis.call('HGET', KEYS[1], 'status') ~= 'staged' then return false end
local cut = redis.call('HGET', KEYS[1], 'cut_epoch')
if cut then return redis.error_reply('CUTOVER ' .. cut) end
local id = redis.call('HGET', KEYS[1], 'id')
redis.call('DEL', unpack(KEYS, 2))
redis.call('HDEL', KEYS[1], 'apply_requested', 'mce', 'mce_hex', 'mce_ts_ms', 'error', 'hydration_epoch',
           'hydrated_from')
redis.call('HSET', KEYS[1], 'status', 'discarded', 'discarded_ts_ms', ARGV[1])
return id
