if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'staged' then
  return 0
end
redis.call('HDEL', KEYS[1], 'apply_requested')
redis.call('HSET', KEYS[1], 'error', ARGV[2])
return 1
