local current = redis.call('HGET', KEYS[1], 'mce_hex')
if current ~= ARGV[1] then
  redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
  return 0
end
swap_staged(5, 2, 3)
return 1
