-- 1: the pending apply withdrawn; 0: none pending (applied or discarded meanwhile); an error reply when
-- its cut-over began in Spark's tasks (replacement_cut.lua): it can only complete.
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged' then
  return 0
end
local cut = redis.call('HGET', KEYS[1], 'cut_epoch')
if cut then return redis.error_reply('CUTOVER ' .. cut) end
redis.call('HDEL', KEYS[1], 'apply_requested')
return 1
