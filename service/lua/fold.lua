-- Fold a closed window's parts into part 0 (docs/ARCHITECTURE.md, "Streams, windows and
-- periods", Partitions): part 0's tables become their sum over the parts (the window's noise
-- and every part's exact counts), staged by plain SETs before the call and moved into place
-- here by RENAME, O(1), with part 0's meta field 'folded' set in the same script. A reader that
-- finds part 0 unfolded before and after its read of part 0 read none of the sum
-- (WindowStore.read_window); the caller deletes parts 1 … P − 1's tables afterwards.
-- KEYS[1] part 0's meta hash, KEYS[2..1+T] its tables (the prior last), KEYS[2+T..1+2T] their
-- staging keys, in the same order; ARGV[1] T.
-- Returns 1 (folded), 0 (folded before: the staging keys are deleted) or -1 (part 0's prior
-- is gone: the window was deleted; the staging keys are deleted).
local n = tonumber(ARGV[1])
local function drop()
  for i = 2 + n, 1 + 2 * n do
    redis.call('DEL', KEYS[i])
  end
end
if redis.call('HGET', KEYS[1], 'folded') == '1' then
  drop()
  return 0
end
if redis.call('EXISTS', KEYS[1 + n]) == 0 then
  drop()
  return -1
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
redis.call('HSET', KEYS[1], 'folded', '1')
return 1
