-- Restores a cut-over found in the view's changelog to a replacement record that lost it (Redis was wiped
-- between the partitions' commits of the cut-over and its Redis commit, and the record was staged again
-- from the catalog): the apply pending and the cut-over fixed at the epoch the partitions hold, as
-- replacement_cut.lua left it, so the view's consumer completes it there. Unlike that script it needs no
-- replacement at the epoch: the re-staged one is hydrated anew and follows to it.
-- KEYS: the replacement's record. ARGV: id, epoch, ts.
-- 1: fixed at this epoch (now or before); 0: not staged under that id; -1: fixed at another epoch.
local record = KEYS[1]
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged' then
  return 0
end
local fixed = redis.call('HGET', record, 'cut_epoch')
if fixed then
  if fixed == ARGV[2] then return 1 end
  return -1
end
if not redis.call('HGET', record, 'apply_requested') then
  redis.call('HSET', record, 'apply_requested', ARGV[3])
end
redis.call('HSET', record, 'cut_epoch', ARGV[2])
return 1
