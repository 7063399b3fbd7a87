-- Accept one ingest batch into one (stream, window), atomically
-- (docs/ARCHITECTURE.md, "Data path"): the window must
-- still be open and the idempotency key new; the raw rows are appended to the window's hot
-- stream. Counting them into the window's tables is done apart, by count.lua (the counting
-- job reads the hot stream from its checkpoint), so a batch costs Redis one XADD per row.
-- A keyed batch is recorded in the window's idem hash: field the keyed token, value the keyed
-- fingerprint (64 hex digits) followed by the response; a key reused with another batch is
-- refused ('mismatch'), never taken for a retry. A batch without a key is recorded nowhere.
-- The hash has no TTL: expire deletes it when the window leaves the hot period.
-- KEYS[1] meta hash, KEYS[2] the window's idem hash, KEYS[3] hot stream, KEYS[4] the batch's
-- key as written before keyed fingerprints (read only).
-- ARGV[1] keyed token ('' for a batch without a key), ARGV[2] fingerprint .. response to
-- store, ARGV[3..] the raw rows (JSON).
-- Returns {'closed'} | {'dup', stored_value} | {'legacy', stored_value} | {'mismatch'} | {'ok'}.
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  return {'closed'}
end
local keyed = ARGV[1] ~= ''
if keyed then
  local prev = redis.call('HGET', KEYS[2], ARGV[1])
  if prev then
    if string.sub(prev, 1, 64) ~= string.sub(ARGV[2], 1, 64) then
      return {'mismatch'}
    end
    return {'dup', prev}
  end
  local old = redis.call('GET', KEYS[4])
  if old then
    return {'legacy', old}
  end
end
for i = 3, #ARGV do
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[i])
end
if keyed then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return {'ok'}
