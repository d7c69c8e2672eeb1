local record = KEYS[1]
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged'
   or not redis.call('HGET', record, 'apply_requested') then
  return 0
end
local mine = redis.call('HGET', record, 'mce_hex')
if not mine or mine < ARGV[2] then return 0 end
local current = redis.call('HGET', KEYS[4], 'mce_hex')
if current and current >= ARGV[2] then return 0 end
swap_staged(2, 5, 2)  -- the replacement's rows and opstate become the view's
for k = 8, #KEYS do redis.call('ZADD', KEYS[k], 0, ARGV[k - 2]) end
local i = #KEYS - 1
local added, removed = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
i = i + 2
for j = i, i + added - 1 do redis.call('ZADD', KEYS[7], 0, ARGV[j]) end
for j = i + added, i + added + removed - 1 do redis.call('ZREM', KEYS[7], ARGV[j]) end
mark_applied(1, 4)
return 1
