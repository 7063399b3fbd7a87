-- Apply the sampled candidates of one batch to an annotation queue (DESIGN §11.2-3), atomically.
-- Only candidates kept by β-sampling reach this script; each is named by its keyed digest.
-- KEYS[1] HyperLogLog, KEYS[2] Count-Mean-Min cells (u32, row after row), KEYS[3] row totals
-- (hash: row -> N_i), KEYS[4] exact counts of flagged keys (hash: digest -> count), KEYS[5]
-- released digests (set), KEYS[6] pool (zset: task id -> uncertainty), KEYS[7] scores (hash:
-- task id -> uncertainty), KEYS[8] released payloads (hash: task id -> JSON), KEYS[9] stats.
-- ARGV[1] k, ARGV[2] width, ARGV[3] depth, ARGV[4] received (all candidates of the batch, for
-- the stats), ARGV[5] n sampled; then per candidate: digest, depth cells, uncertainty, task id,
-- payload JSON.
-- A key is flagged when its Count-Mean-Min estimate reaches k (rounded); from then on its
-- occurrences are counted exactly, and it is released when that exact count reaches k: so a
-- released key has at least k sampled occurrences whatever the sketch says. The payload of
-- the releasing candidate becomes the task; nothing else of a candidate is kept.
-- Returns the released task ids.
local k = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local d = tonumber(ARGV[3])
local n = tonumber(ARGV[5])
redis.call('HINCRBY', KEYS[9], 'received', tonumber(ARGV[4]))
if n > 0 then
  redis.call('HINCRBY', KEYS[9], 'sampled', n)
end
local released = {}
local pos = 6
for _ = 1, n do
  local digest = ARGV[pos]
  local get = {}
  local offs = {}
  for i = 1, d do
    offs[i] = (i - 1) * w + tonumber(ARGV[pos + i])
    get[#get + 1] = 'GET'
    get[#get + 1] = 'u32'
    get[#get + 1] = '#' .. offs[i]
  end
  local uncertainty = ARGV[pos + d + 1]
  local task = ARGV[pos + d + 2]
  local payload = ARGV[pos + d + 3]
  pos = pos + d + 4
  redis.call('PFADD', KEYS[1], digest)
  -- conservative update: raise only the cells below min + 1
  local c = redis.call('BITFIELD', KEYS[2], unpack(get))
  local lo = c[1]
  for i = 2, d do
    if c[i] < lo then lo = c[i] end
  end
  local set = {}
  for i = 1, d do
    if c[i] < lo + 1 then
      set[#set + 1] = 'SET'
      set[#set + 1] = 'u32'
      set[#set + 1] = '#' .. offs[i]
      set[#set + 1] = lo + 1
      redis.call('HINCRBY', KEYS[3], i - 1, lo + 1 - c[i])
      c[i] = lo + 1
    end
  end
  if #set > 0 then
    redis.call('BITFIELD', KEYS[2], unpack(set))
  end
  if redis.call('SISMEMBER', KEYS[5], digest) == 0 then
    local exact = redis.call('HGET', KEYS[4], digest)
    if exact then
      exact = redis.call('HINCRBY', KEYS[4], digest, 1)
    else
      -- Count-Mean-Min: r_i = c_i - (N_i - c_i)/(w - 1); clamp(median, 0, min c_i)
      local fields = {}
      for i = 1, d do fields[i] = i - 1 end
      local totals = redis.call('HMGET', KEYS[3], unpack(fields))
      local r = {}
      local cmin = c[1]
      for i = 1, d do
        r[i] = c[i] - ((tonumber(totals[i]) or 0) - c[i]) / (w - 1)
        if c[i] < cmin then cmin = c[i] end
      end
      table.sort(r)
      local med
      if d % 2 == 1 then
        med = r[(d + 1) / 2]
      else
        med = (r[d / 2] + r[d / 2 + 1]) / 2
      end
      if med < 0 then med = 0 end
      if med > cmin then med = cmin end
      if med >= k - 0.5 then
        redis.call('HSET', KEYS[4], digest, 1)
        exact = 1
      end
    end
    if exact and exact >= k then
      redis.call('SADD', KEYS[5], digest)
      redis.call('HDEL', KEYS[4], digest)
      redis.call('ZADD', KEYS[6], uncertainty, task)
      redis.call('HSET', KEYS[7], task, uncertainty)
      redis.call('HSET', KEYS[8], task, payload)
      redis.call('HINCRBY', KEYS[9], 'released', 1)
      released[#released + 1] = task
    end
  end
end
return released
