-- 1: marked as stopped by an error; 0: not staged under that id, or its cut-over began in Spark's tasks
-- (replacement_cut.lua: some partitions may hold it, so it must complete, not stop).
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged'
   or redis.call('HEXISTS', KEYS[1], 'cut_epoch') == 1 then
  return 0
end
redis.call('HDEL', KEYS[1], 'apply_requested')
redis.call('HSET', KEYS[1], 'error', ARGV[2])
return 1
