local function swap_staged(staged, live, count)
  for i = 0, count - 1 do
    if redis.call('EXISTS', KEYS[staged + i]) == 1 then
      redis.call('RENAME', KEYS[staged + i], KEYS[live + i])
    else
      redis.call('DEL', KEYS[live + i])
    end
  end
end
