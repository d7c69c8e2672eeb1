-- Fixes a pending apply's cut-over at an epoch before Spark's tasks write it, a view partition each
-- (services/replacement/cut_over.py): from then on the apply can be neither withdrawn nor discarded, and
-- the replacement stops failing, so a consumer that dies with some partitions' cut-over in Kafka leaves
-- it for the next one to complete at the same epoch.
-- With ARGV[4] = '1' the cut-over was found in the view's changelog instead, by a record that lost it
-- (Redis wiped between the partitions' commits and the cut-over's Redis commit, the record staged again
-- from the catalog): it is fixed again there, the apply made pending, whatever the replacement's epoch
-- (staged anew, it follows to the cut-over's epoch first).
-- KEYS: the replacement's record. ARGV: id, epoch hex, epoch, found in the log ('1' / '0'), ts.
-- 1: fixed at this epoch (now or by an earlier attempt); 0: not staged under that id, or (from the tasks)
-- no apply pending; -1: fixed at another epoch; -2 (from the tasks): the replacement is not at the epoch
-- (its rows are not the cut-over's, so the tasks' diff of them would be wrong: it must follow there first).
local record = KEYS[1]
local from_log = ARGV[4] == '1'
if redis.call('HGET', record, 'id') ~= ARGV[1] or redis.call('HGET', record, 'status') ~= 'staged'
   or not (from_log or redis.call('HGET', record, 'apply_requested')) then
  return 0
end
local fixed = redis.call('HGET', record, 'cut_epoch')
if fixed and fixed ~= ARGV[3] then
  return -1
end
if not from_log and redis.call('HGET', record, 'mce_hex') ~= ARGV[2] then
  return -2
end
if from_log and not redis.call('HGET', record, 'apply_requested') then
  redis.call('HSET', record, 'apply_requested', ARGV[5])
end
redis.call('HSET', record, 'cut_epoch', ARGV[3])
return 1
