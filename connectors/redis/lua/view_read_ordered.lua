local out = {redis.call('HGET', KEYS[1], 'mce') or '', redis.call('HLEN', KEYS[2])}
local budget = tonumber(ARGV[1])
local i = 2
while i <= #ARGV and budget > 0 do
  local members = redis.call('ZRANGEBYLEX', KEYS[3], ARGV[i + 1], ARGV[i + 2], 'LIMIT', 0, budget)
  local n = #members
  out[#out + 1] = ARGV[i]
  out[#out + 1] = n
  out[#out + 1] = (n < budget) and 1 or 0
  local fields = {}
  for j = 1, n do
    local m = members[j]
    local len = string.byte(m, -2) * 256 + string.byte(m, -1)
    fields[j] = string.sub(m, -2 - len, -3)
    out[#out + 1] = m
  end
  local j = 1
  while j <= n do
    local k = math.min(j + 511, n)
    local values = redis.call('HMGET', KEYS[2], unpack(fields, j, k))
    for x = 1, k - j + 1 do out[#out + 1] = values[x] end
    j = k + 1
  end
  budget = budget - n
  i = i + 3
end
return out
