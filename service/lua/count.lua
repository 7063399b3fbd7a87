-- Count a run of a window's hot-stream entries into its tables, exactly once
-- (docs/ARCHITECTURE.md, "Data path", "Count tables"):
-- a compare-and-set on the window's counting checkpoint (meta field 'counted': the id of the
-- last entry counted; absent before the first), then every table's new cells or increments,
-- the per-user counters (streams with a user key) and the new checkpoint, all in one script.
-- The script is kept short (Redis serves nobody else while it runs): a table with many
-- increments was read, added to and written by the counter to a staging key before the call
-- (plain GET and SET, which Redis interleaves with other clients), and is moved into place
-- here by RENAME, O(1); only tables with few increments are incremented here (BITFIELD), and
-- the counter caps those ops per call.
-- KEYS[1] meta hash, KEYS[2] per-user counters hash, KEYS[3] the counted rows by column (a
-- list, one element per counted run, in order), KEYS[4..3+T] count tables, KEYS[4+T] the
-- prior table, then one staging key per 's' table, in table order, then the window's list of
-- batches not yet counted and the list of their entry ids (ingest.lua), last.
-- ARGV[1] expected checkpoint ('' when none), ARGV[2] new checkpoint, ARGV[3] number of
-- tables T+1 (the prior included), ARGV[4] one character per table: 's' (its new cells are in
-- its staging key: the counter read them with the checkpoint it expects and added its
-- increments) or 'i' (its value is its increments as one string '#<cell> <delta> ...', summed
-- per cell; the pieces are BITFIELD arguments as they are), ARGV[5..4+T+1] the values ('' for
-- an 's' table), then the counters' TTL (s) and 'user count user count ...' pairs (may be
-- empty): each user's observations seen in the window so far, then the run's rows by column,
-- then how many batches at the head of the list the run counted (or found counted): popped.
-- Returns {'ok'} | {'stale', checkpoint} | {'missing', key}: a missing table (the window was
-- deleted) or staging key (expired before the call; the counter starts the run again).
local current = redis.call('HGET', KEYS[1], 'counted') or ''
if current ~= ARGV[1] then
  return {'stale', current}
end
local n_tables = tonumber(ARGV[3])
local modes = ARGV[4]
local staged = 3 + n_tables
for t = 1, n_tables do
  if redis.call('EXISTS', KEYS[3 + t]) == 0 then
    return {'missing', KEYS[3 + t]}
  end
  if string.sub(modes, t, t) == 's' then
    staged = staged + 1
    if redis.call('EXISTS', KEYS[staged]) == 0 then
      return {'missing', KEYS[staged]}
    end
  end
end
local LAST = 2 + 4 * 1000 -- 1000 ops per BITFIELD call: 4002 arguments, within unpack's limit
local args = {'OVERFLOW', 'SAT'}
staged = 3 + n_tables
for t = 1, n_tables do
  local key = KEYS[3 + t]
  if string.sub(modes, t, t) == 's' then
    staged = staged + 1
    redis.call('RENAME', KEYS[staged], key)
    redis.call('PERSIST', key) -- the staging key's TTL came with it; tables have none
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
local pops = tonumber(ARGV[pos + 3] or '0')
if pops > 0 then
  redis.call('LPOP', KEYS[#KEYS - 1], pops)
  redis.call('LPOP', KEYS[#KEYS], pops)
end
redis.call('HSET', KEYS[1], 'counted', ARGV[2])
return {'ok'}
