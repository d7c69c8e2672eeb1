local meta = KEYS[1]
local refused = refuse_epoch(meta, ARGV[1], ARGV[13])
if refused then
  return refused
end
-- ZADD of members with score 0, 256 members per call.
local function zadd_all(key, first, count)
  local i = first
  while i < first + count do
    local args = {}
    for j = i, math.min(i + 255, first + count - 1) do
      args[#args + 1] = 0
      args[#args + 1] = ARGV[j]
    end
    redis.call('ZADD', key, unpack(args))
    i = i + 256
  end
  return first + count
end
local i = 14
i = each_chunk('HSET', KEYS[2], i, tonumber(ARGV[4]), 2)
i = each_chunk('HDEL', KEYS[2], i, tonumber(ARGV[5]), 1)
i = each_chunk('HSET', KEYS[3], i, tonumber(ARGV[6]), 2)
i = each_chunk('HDEL', KEYS[3], i, tonumber(ARGV[7]), 1)
i = zadd_all(KEYS[4], i, tonumber(ARGV[8]))
i = each_chunk('ZREM', KEYS[4], i, tonumber(ARGV[9]), 1)
i = each_chunk('HSET', KEYS[5], i, tonumber(ARGV[10]), 2)
local journal = tonumber(ARGV[11])
if journal > 0 then
  i = each_chunk('RPUSH', KEYS[6], i, journal, 1)
  redis.call('LTRIM', KEYS[6], -JOURNAL_LIMIT, -1)
end
for k = 7, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[i]); i = i + 1 end
redis.call('HSET', meta, 'mce_hex', ARGV[1], 'mce', ARGV[2], 'mce_ts_ms', ARGV[3])
if ARGV[12] ~= '' then
  redis.call('HSET', meta, 'state', ARGV[12], 'reason', '', 'state_ts_ms', ARGV[3])
end
return 1
