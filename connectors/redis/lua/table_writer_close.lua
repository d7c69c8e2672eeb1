if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'token')
  redis.call('HSET', KEYS[1], 'state', 'stopped')
  return 1
end
return 0
