local function each_chunk(command, key, first, count, width)
  local last = first + count * width - 1
  local i = first
  while i <= last do
    local j = math.min(i + 512 * width - 1, last)
    redis.call(command, key, unpack(ARGV, i, j))
    i = j + 1
  end
  return last + 1
end
