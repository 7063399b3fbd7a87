-- Which window a keyed batch goes to (docs/ARCHITECTURE.md, "Data path"): the stream-level
-- pointer of its Idempotency-Key, atomically with the stream's epoch pointer (both in the
-- stream's slot). The first request with a key points it at the open epoch; every later one
-- (a retry, a racing twin) is sent to the window it points at, where ingest.lua either finds
-- the batch's record (a replay) or accepts the batch once. The pointer moves on only from a
-- window that ingest.lua found closed without the key's record (such a window can never take
-- it), so the batch is accepted in at most one window, whatever the rolls.
-- A pointer is made only while the stream holds fewer than ARGV[4] of them: each is counted in
-- the bucket of the time it was made (KEYS[3], the current one, which lives ARGV[5] seconds),
-- and every bucket that may still hold a live pointer is summed (KEYS[3..]).
-- KEYS[1] the key's pointer, KEYS[2] the stream's epoch pointer, KEYS[3..] the count buckets
-- (only when ARGV[3] is '1').
-- ARGV[1] the pointer's life in seconds (set when it is made, kept when it moves),
-- ARGV[2] the window the caller found closed without the record ('' for none),
-- ARGV[3] '1' to make a missing pointer, '0' only to look, '2' to make it neither counted
-- nor capped (the pointer of a batch's part p >= 1: its part 0's pointer was counted),
-- ARGV[4] the cap, ARGV[5] the current bucket's life in seconds.
-- Returns {'none'} (no open epoch) | {'new', epoch} | {'absent', epoch} (not made) |
-- {'full', epoch} (not made: the cap is reached) | {'at', window} | {'moved', epoch}.
local at = redis.call('GET', KEYS[1])
if at and at ~= ARGV[2] then
  return {'at', at}
end
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  return {'none'}
end
if at then
  if tonumber(epoch) <= tonumber(at) then
    return {'at', at}
  end
  redis.call('SET', KEYS[1], epoch, 'KEEPTTL')
  return {'moved', epoch}
end
if ARGV[3] == '2' then
  redis.call('SET', KEYS[1], epoch, 'EX', ARGV[1])
  return {'new', epoch}
end
if ARGV[3] ~= '1' then
  return {'absent', epoch}
end
local made = 0
for i = 3, #KEYS do
  made = made + tonumber(redis.call('GET', KEYS[i]) or '0')
end
if made >= tonumber(ARGV[4]) then
  return {'full', epoch}
end
redis.call('SET', KEYS[1], epoch, 'EX', ARGV[1])
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[5])
return {'new', epoch}
