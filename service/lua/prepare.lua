-- Move a window's noise-initialised tables into place unless the window is already open or
-- closed (so a late or duplicate preparation can never overwrite tables that hold data).
-- The tables were staged by plain SETs (Redis serves other clients between them); here each
-- is moved by RENAME, O(1), so the script never holds Redis for the tables' bytes.
-- KEYS[1] meta hash, KEYS[2..1+T] tables (the prior last), KEYS[2+T..1+2T] their staging
-- keys, in the same order; ARGV[1] the state to set ('prepared' or 'open'), ARGV[2] T.
-- Returns 1 (written) or 0 (the window was open or closed: the staging keys are deleted).
local n = tonumber(ARGV[2])
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'open' or state == 'closed' then
  for i = 2 + n, 1 + 2 * n do
    redis.call('DEL', KEYS[i])
  end
  return 0
end
for i = 2, 1 + n do
  if redis.call('EXISTS', KEYS[i + n]) == 0 then
    return redis.error_reply('staging key ' .. KEYS[i + n] .. ' is gone')
  end
end
for i = 2, 1 + n do
  redis.call('RENAME', KEYS[i + n], KEYS[i])
  redis.call('PERSIST', KEYS[i])
end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
return 1
