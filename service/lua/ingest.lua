-- Apply one ingest batch to one (stream, window), atomically (DESIGN §7).
-- KEYS[1] meta hash, KEYS[2] idempotency key, KEYS[3] hot stream, KEYS[4..] count tables
-- (the prior table included; all must exist: a missing table means the window was never
-- prepared, and BITFIELD would silently create a noise-free table).
-- ARGV[1] idempotency TTL (s), ARGV[2] response to store, ARGV[3] number of tables T,
-- then for each table: n, followed by n pairs (#cell, delta); then the number of rows R and
-- R raw rows (JSON) for the hot stream.
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
local pos = 4
local CHUNK = 1000
for t = 1, n_tables do
  local key = KEYS[3 + t]
  local n = tonumber(ARGV[pos])
  pos = pos + 1
  local done = 0
  while done < n do
    local m = math.min(n - done, CHUNK)
    local args = {'OVERFLOW', 'SAT'}
    for _ = 1, m do
      args[#args + 1] = 'INCRBY'
      args[#args + 1] = 'i32'
      args[#args + 1] = ARGV[pos]
      args[#args + 1] = ARGV[pos + 1]
      pos = pos + 2
    end
    redis.call('BITFIELD', key, unpack(args))
    done = done + m
  end
end
local n_rows = tonumber(ARGV[pos])
pos = pos + 1
for _ = 1, n_rows do
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[pos])
  pos = pos + 1
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[1]))
return {'ok'}
