-- Applies one partition's six staged keys, KEYS[first .. first + 5] (row puts: hash, row deletes: set,
-- key-order puts and deletes: sets, state puts: hash, state deletes: set), to `rows`, `keyorder` (nil:
-- none kept) and `opstate`, in calls of at most 1024 items each, then deletes them.
local function apply_staged(first, rows, keyorder, opstate)
  local function chunked(command, key, items, width, prefix)
    local i = 1
    while i <= #items do
      local args = {}
      for j = i, math.min(i + 1024 * width - 1, #items) do
        if prefix then args[#args + 1] = prefix end
        args[#args + 1] = items[j]
      end
      redis.call(command, key, unpack(args))
      i = i + 1024 * width
    end
  end
  chunked('HSET', rows, redis.call('HGETALL', KEYS[first]), 2, nil)
  chunked('HDEL', rows, redis.call('SMEMBERS', KEYS[first + 1]), 1, nil)
  if keyorder then
    chunked('ZADD', keyorder, redis.call('SMEMBERS', KEYS[first + 2]), 1, 0)
    chunked('ZREM', keyorder, redis.call('SMEMBERS', KEYS[first + 3]), 1, nil)
  end
  chunked('HSET', opstate, redis.call('HGETALL', KEYS[first + 4]), 2, nil)
  chunked('HDEL', opstate, redis.call('SMEMBERS', KEYS[first + 5]), 1, nil)
  redis.call('DEL', KEYS[first], KEYS[first + 1], KEYS[first + 2], KEYS[first + 3], KEYS[first + 4],
             KEYS[first + 5])
end

-- Whether the six staged keys of each of `n` partitions, from KEYS[first], hold the counts the tasks
-- reported, ARGV[counts ..] (six per partition, in the keys' order).
local function staged_whole(first, n, counts)
  local sizes = {'HLEN', 'SCARD', 'SCARD', 'SCARD', 'HLEN', 'SCARD'}
  for p = 0, n - 1 do
    for j = 0, 5 do
      if redis.call(sizes[j + 1], KEYS[first + 6 * p + j]) ~= tonumber(ARGV[counts + 6 * p + j]) then
        return false
      end
    end
  end
  return true
end
