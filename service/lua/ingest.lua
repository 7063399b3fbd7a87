-- Accept one ingest batch into one (stream, window), atomically
-- (docs/ARCHITECTURE.md, "Data path"): the idempotency key must be new to the window and the
-- window still open; the raw rows are appended to the window's hot stream. Counting them into
-- the window's tables is done apart, by count.lua (the counting job reads the hot stream from
-- its checkpoint), so a batch costs Redis one XADD per row.
-- A keyed batch is recorded in the window's idem hash: field the keyed token, value the keyed
-- fingerprint (64 hex digits) followed by the response; the caller compares the fingerprint
-- of a record found ('dup') with its own, so a key reused with another batch is refused, never
-- taken for a retry. A batch without a key is recorded nowhere.
-- The record is looked up before the window's state: 'closed' means the window takes no more
-- batches and never took this key's (the stream-level pointer may then move on, claim.lua).
-- The hash expires ARGV[3] seconds after its last record (idempotency_ttl_seconds), or after
-- the first retry found in it if it was made without a TTL.
-- With ARGV[5] '1' the batch is also appended, whole, to the window's list of batches not yet
-- counted (KEYS[5]: '<row>,<row>,...'), and its entry ids to the list beside it (KEYS[6]:
-- '<first id> <last id> <rows>'), atomically with its entries, so both lists are in entry
-- order: the counting job reads a run of batches as a few bulk strings instead of an entry (a
-- tuple and a dict in redis-py) per row, and count.lua pops what it counted from both.
-- KEYS[1] meta hash, KEYS[2] the window's idem hash, KEYS[3] hot stream, KEYS[4] the batch's
-- key as written before keyed fingerprints (read only), KEYS[5] the batches list, KEYS[6] the
-- list of their entry ids.
-- ARGV[1] keyed token ('' for a batch without a key), ARGV[2] fingerprint .. response to
-- store, ARGV[3] the record's life in seconds, ARGV[4] the key's token as written before
-- tokens were scoped to their producer ('' for none; read only), ARGV[5] '1' to list the
-- batch for counting ('' not to), ARGV[6..] the raw rows (JSON).
-- Returns {'closed'} | {'dup', stored_value} | {'unscoped', stored_value} |
-- {'legacy', stored_value} | {'ok'}.
local keyed = ARGV[1] ~= ''
if keyed then
  local prev = redis.call('HGET', KEYS[2], ARGV[1])
  if prev then
    if redis.call('TTL', KEYS[2]) == -1 then
      -- made when records went with the hot period: a pointer now leads here, keep it as long
      redis.call('EXPIRE', KEYS[2], ARGV[3])
    end
    return {'dup', prev}
  end
  if ARGV[4] ~= '' then
    local unscoped = redis.call('HGET', KEYS[2], ARGV[4])
    if unscoped then
      if redis.call('TTL', KEYS[2]) == -1 then
        redis.call('EXPIRE', KEYS[2], ARGV[3])
      end
      return {'unscoped', unscoped}
    end
  end
  local old = redis.call('GET', KEYS[4])
  if old then
    return {'legacy', old}
  end
end
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  return {'closed'}
end
local first, last
for i = 6, #ARGV do
  last = redis.call('XADD', KEYS[3], '*', 'd', ARGV[i])
  first = first or last
end
if first and ARGV[5] == '1' then
  redis.call('RPUSH', KEYS[5], table.concat(ARGV, ',', 6))
  redis.call('RPUSH', KEYS[6], first .. ' ' .. last .. ' ' .. (#ARGV - 5))
end
if keyed then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return {'ok'}
