-- KEYS: the legacy marker, the legacy catalog, the marker, the catalog. 1: moved; 0: nothing to move.
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('RENAME', KEYS[2], KEYS[4])
end
redis.call('RENAME', KEYS[1], KEYS[3])
return 1
