-- Apply one ingest batch of a stream with a user key (DESIGN §4, user-level privacy):
-- like ingest.lua, but observation by observation, counting at most c observations per user
-- per window; the others still go to the hot stream. Atomic per (stream, window).
-- KEYS[1] meta hash, KEYS[2] idempotency key, KEYS[3] hot stream, KEYS[4] per-user counters
-- (a hash: keyed user hash -> observations seen), KEYS[5 .. 4+T] count tables, KEYS[5+T] the
-- prior table.
-- ARGV[1] idempotency TTL, ARGV[2] response, ARGV[3] T, ARGV[4] c, ARGV[5] counter TTL,
-- ARGV[6] n observations, then per observation: user hash, prior cell ('#<label>'), and T
-- strings '#<cell> <delta> ...' (its increments in each table); then R and R raw rows.
-- Returns {'closed'} | {'dup', stored} | {'missing', key} | {'ok', counted}.
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  return {'closed'}
end
local prev = redis.call('GET', KEYS[2])
if prev then
  return {'dup', prev}
end
local n_tables = tonumber(ARGV[3])
for t = 1, n_tables + 1 do
  if redis.call('EXISTS', KEYS[4 + t]) == 0 then
    return {'missing', KEYS[4 + t]}
  end
end
local c = tonumber(ARGV[4])
local n = tonumber(ARGV[6])
local pos = 7
local counted = 0
for _ = 1, n do
  local seen = redis.call('HINCRBY', KEYS[4], ARGV[pos], 1)
  if seen <= c then
    counted = counted + 1
    for t = 1, n_tables do
      local args = {'OVERFLOW', 'SAT'}
      for cell, delta in string.gmatch(ARGV[pos + 1 + t], '(%S+) (%S+)') do
        args[#args + 1] = 'INCRBY'
        args[#args + 1] = 'i32'
        args[#args + 1] = cell
        args[#args + 1] = delta
      end
      redis.call('BITFIELD', KEYS[4 + t], unpack(args))
    end
    redis.call('BITFIELD', KEYS[5 + n_tables], 'OVERFLOW', 'SAT', 'INCRBY', 'i32', ARGV[pos + 1], 1)
  end
  pos = pos + 2 + n_tables
end
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[5]))
local n_rows = tonumber(ARGV[pos])
pos = pos + 1
for _ = 1, n_rows do
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[pos])
  pos = pos + 1
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[1]))
return {'ok', counted}
