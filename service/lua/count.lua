-- Count a run of a window's hot-stream entries into its tables, exactly once
-- (docs/ARCHITECTURE.md, "Data path", "Count tables"):
-- a compare-and-set on the window's counting checkpoint (meta field 'counted': the id of the
-- last entry counted; absent before the first), then every cell increment, the per-user
-- counters (streams with a user key) and the new checkpoint, all in one script.
-- KEYS[1] meta hash, KEYS[2] per-user counters hash, KEYS[3] the counted rows by column (a
-- list, one element per counted run, in order), KEYS[4..3+T] count tables, KEYS[4+T] the
-- prior table.
-- ARGV[1] expected checkpoint ('' when none), ARGV[2] new checkpoint, ARGV[3] number of
-- tables T+1 (the prior included), ARGV[4] one character per table: 's' (its value is the
-- table's new cells, written whole: the counter read them with the checkpoint and added its
-- increments) or 'i' (its value is its increments as one string '#<cell> <delta> ...',
-- summed per cell; the pieces are BITFIELD arguments as they are), ARGV[5..4+T+1] the
-- values, then the counters' TTL (s) and 'user count user count ...' pairs (may be empty):
-- each user's observations seen in the window so far, then the run's rows by column.
-- Returns {'ok'} | {'stale', checkpoint} | {'missing', key}.
local current = redis.call('HGET', KEYS[1], 'counted') or ''
if current ~= ARGV[1] then
  return {'stale', current}
end
local n_tables = tonumber(ARGV[3])
for t = 1, n_tables do
  if redis.call('EXISTS', KEYS[3 + t]) == 0 then
    return {'missing', KEYS[3 + t]}
  end
end
local LAST = 2 + 4 * 1000 -- 1000 ops per BITFIELD call: 4002 arguments, within unpack's limit
local args = {'OVERFLOW', 'SAT'}
local modes = ARGV[4]
for t = 1, n_tables do
  local key = KEYS[3 + t]
  if string.sub(modes, t, t) == 's' then
    redis.call('SET', key, ARGV[4 + t])
  else
    local k = 2
    for cell, delta in string.gmatch(ARGV[4 + t], '(%S+) (%S+)') do
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
end
local pos = 5 + n_tables
local ttl = tonumber(ARGV[pos])
local pairs_ = {}
local k = 0
for user, seen in string.gmatch(ARGV[pos + 1], '(%S+) (%S+)') do
  pairs_[k + 1] = user
  pairs_[k + 2] = seen
  k = k + 2
  if k == 4000 then
    redis.call('HSET', KEYS[2], unpack(pairs_, 1, k))
    k = 0
  end
end
if k > 0 then
  redis.call('HSET', KEYS[2], unpack(pairs_, 1, k))
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('EXPIRE', KEYS[2], ttl)
end
if ARGV[pos + 2] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[pos + 2])
end
redis.call('HSET', KEYS[1], 'counted', ARGV[2])
return {'ok'}
