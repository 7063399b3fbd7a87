-- Accept one ingest batch into one (stream, window), atomically
-- (docs/ARCHITECTURE.md, "Data path"): the window must
-- still be open and the idempotency key new; the raw rows are appended to the window's hot
-- stream. Counting them into the window's tables is done apart, by count.lua (the counting
-- job reads the hot stream from its checkpoint), so a batch costs Redis one XADD per row.
-- The idempotency key holds the batch's fingerprint (64 hex digits) followed by the response:
-- a key reused with another batch is refused ('mismatch'), never taken for a retry.
-- KEYS[1] meta hash, KEYS[2] idempotency key, KEYS[3] hot stream.
-- ARGV[1] idempotency TTL (s), ARGV[2] fingerprint .. response to store, ARGV[3..] the raw
-- rows (JSON).
-- Returns {'closed'} | {'dup', stored_value} | {'mismatch'} | {'ok'}.
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  return {'closed'}
end
local prev = redis.call('GET', KEYS[2])
if prev then
  -- a value stored before fingerprints (a response only, JSON): a retry, as it was then
  if string.sub(prev, 1, 1) == '{' then
    return {'dup', prev}
  end
  if string.sub(prev, 1, 64) ~= string.sub(ARGV[2], 1, 64) then
    return {'mismatch'}
  end
  return {'dup', prev}
end
for i = 3, #ARGV do
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[i])
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[1]))
return {'ok'}
