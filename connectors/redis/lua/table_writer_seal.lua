-- Epochs exceed a double's 53 bits: compared as decimal strings (no sign, no leading zeros).
if redis.call('HGET', KEYS[1], 'state') ~= 'stopped' then return 0 end
local sealed = redis.call('HGET', KEYS[1], 'sealed') or '0'
local wanted = ARGV[1]
if #wanted > #sealed or (#wanted == #sealed and wanted > sealed) then
  redis.call('HSET', KEYS[1], 'sealed', wanted)
end
return 1
