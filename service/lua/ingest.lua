-- Apply one ingest batch to one (stream, window), atomically (DESIGN §7).
-- KEYS[1] meta hash, KEYS[2] idempotency key, KEYS[3] hot stream, KEYS[4..] count tables
-- (the prior table included; all must exist: a missing table means the window was never
-- prepared, and BITFIELD would silently create a noise-free table).
-- ARGV[1] idempotency TTL (s), ARGV[2] response to store, ARGV[3] number of tables T,
-- ARGV[4 .. 3+T] each table's increments as one string '#<cell> <delta> #<cell> <delta> ...'
-- (summed per cell; the pieces are BITFIELD arguments as they are); then the number of rows R
-- and R raw rows (JSON) for the hot stream.
-- Returns {'closed'} | {'dup', stored_response} | {'missing', key} | {'ok'}.
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  return {'closed'}
end
local prev = redis.call('GET', KEYS[2])
if prev then
  return {'dup', prev}
end
local n_tables = tonumber(ARGV[3])
for t = 1, n_tables do
  if redis.call('EXISTS', KEYS[3 + t]) == 0 then
    return {'missing', KEYS[3 + t]}
  end
end
local LAST = 2 + 4 * 1000 -- 1000 ops per BITFIELD call: 4002 arguments, within unpack's limit
local args = {'OVERFLOW', 'SAT'}
for t = 1, n_tables do
  local key = KEYS[3 + t]
  local k = 2
  for cell, delta in string.gmatch(ARGV[3 + t], '(%S+) (%S+)') do
    args[k + 1] = 'INCRBY'
    args[k + 2] = 'i32'
    args[k + 3] = cell
    args[k + 4] = delta
    k = k + 4
    if k == LAST then
      redis.call('BITFIELD', key, unpack(args, 1, k))
      k = 2
    end
  end
  if k > 2 then
    redis.call('BITFIELD', key, unpack(args, 1, k))
  end
end
local pos = 4 + n_tables
local n_rows = tonumber(ARGV[pos])
pos = pos + 1
for _ = 1, n_rows do
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[pos])
  pos = pos + 1
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[1]))
return {'ok'}
