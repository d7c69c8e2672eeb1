"""Lua functions shared by mvlog's Redis scripts, prepended to each script's text.

Redis runs each script in a fresh Lua environment, so shared helpers cannot be loaded once; they are
kept here, once, and prefixed to every script that needs them.
"""

from __future__ import annotations

#: ``each_chunk(command, key, first, count, width)``: ``redis.call(command, key, ...)`` over
#: ``ARGV[first .. first + count * width - 1]`` in calls of at most 512 items of ``width`` arguments
#: (Lua's stack is small); returns the index after the last argument used.
EACH_CHUNK = """
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
"""

#: ``swap_staged(staged, live, count)``: for i in 0 .. count - 1, ``KEYS[staged + i]`` replaces
#: ``KEYS[live + i]`` (RENAME), or ``KEYS[live + i]`` is deleted when nothing was staged for it.
SWAP_STAGED = """
local function swap_staged(staged, live, count)
  for i = 0, count - 1 do
    if redis.call('EXISTS', KEYS[staged + i]) == 1 then
      redis.call('RENAME', KEYS[staged + i], KEYS[live + i])
    else
      redis.call('DEL', KEYS[live + i])
    end
  end
end
"""
