-- Fixes a pending apply's cut-over at an epoch before Spark's tasks write it, a view partition each
-- (services/replacement/cut_over.py): from then on the apply can be neither withdrawn nor discarded, and
-- the replacement stops failing, so a consumer that dies with some partitions' cut-over in Kafka leaves
-- it for the next one to complete at the same epoch.
-- KEYS: the replacement's record. ARGV: id, epoch hex, epoch.
-- 1: fixed at this epoch (now or by an earlier attempt); 0: not staged under that id, no apply pending,
-- or the replacement is not at the epoch; -1: fixed at another epoch.
local record = KEYS[1]
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged'
   or not redis.call('HGET', record, 'apply_requested') then
  return 0
end
local fixed = redis.call('HGET', record, 'cut_epoch')
if fixed then
  if fixed == ARGV[3] then return 1 end
  return -1
end
if redis.call('HGET', record, 'mce_hex') ~= ARGV[2] then return 0 end
redis.call('HSET', record, 'cut_epoch', ARGV[3])
return 1
