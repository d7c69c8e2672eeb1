-- A replacement's cut-over committed (replacement_apply.lua, replacement_cut_over.lua): the view's MCE moved to
-- the epoch (KEYS[meta]) and the replacement's record (KEYS[record]) marked applied there; ARGV[2 .. 5]: the
-- epoch in hex, the epoch, now (ms), the view's new version.
local function mark_applied(record, meta)
  redis.call('HSET', KEYS[meta], 'mce_hex', ARGV[2], 'mce', ARGV[3], 'mce_ts_ms', ARGV[4])
  redis.call('HDEL', KEYS[record], 'apply_requested', 'cut_epoch', 'mce', 'mce_hex', 'mce_ts_ms')
  redis.call('HSET', KEYS[record], 'status', 'applied', 'applied_epoch', ARGV[3], 'applied_version', ARGV[5],
             'applied_ts_ms', ARGV[4])
end
