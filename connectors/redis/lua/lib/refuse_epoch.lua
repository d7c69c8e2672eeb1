-- Whether an epoch commit is refused by the view's meta hash: 0 when the epoch (hex) is at or below the
-- MCE, -1 when the MCE is not `follows` (its hex, 'none' for no MCE, '' unchecked), nil to go on.
local function refuse_epoch(meta, epoch_hex, follows)
  local current = redis.call('HGET', meta, 'mce_hex')
  if current and current >= epoch_hex then
    return 0
  end
  if follows ~= '' and (current or 'none') ~= follows then
    return -1
  end
  return nil
end
