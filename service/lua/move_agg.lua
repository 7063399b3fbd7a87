-- Move a staged aggregate into place, unless the stream already serves a later epoch (an
-- aggregate of an earlier epoch may hold a window whose tables expiry has deleted, so it
-- must never land after that expiry): KEYS[1] the staging key, KEYS[2] the aggregate's key,
-- KEYS[3] the stream's `served` pointer, KEYS[4] the set of staging keys; ARGV[1] the
-- aggregate's epoch. Returns 1 when moved, 0 when dropped (the staging key is deleted).
redis.call('SREM', KEYS[4], KEYS[1])
local served = tonumber(redis.call('GET', KEYS[3]))
if served ~= nil and served > tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('PERSIST', KEYS[2])
return 1
