-- Close, then release, one period of an annotation queue, atomically per call; and forget the
-- scores of expired reference models (docs/ARCHITECTURE.md, "Annotation queues", step 3).
-- KEYS[1] closed (string), KEYS[2] periods (zset), KEYS[3] released keys (set of key digests),
-- KEYS[4] pool (zset: task id -> uncertainty), KEYS[5] scores (hash: task id -> uncertainty),
-- KEYS[6] payloads (hash: task id -> JSON), KEYS[7] stats, KEYS[8] the period's counts,
-- KEYS[9] the period's ready classes, KEYS[10] scored (hash: task id -> the epoch of the
-- reference model that scored it).
-- ARGV[1] 'close' | 'release' | 'forget', ARGV[2] period (for 'forget': an epoch).
-- 'close': no batch is counted into this period or an earlier one from now on
--   (queue_candidates.lua answers 'closed'), so its ready classes are final. Returns {'ok'}.
-- 'release': ARGV[3] n, then per task: key digest, task id, uncertainty, payload JSON, the
--   scoring model's epoch ('' when no model scored it). Runs once per period (a period no
--   longer in `periods` is done: returns {}): each task whose key was never released enters
--   the pool; the period's counts and ready classes are deleted. Returns the released task ids.
-- 'forget': ARGV[3] the fallback uncertainty: every task scored by a model of an epoch before
--   ARGV[2] (1e300: any) gets the fallback, in the pool and in its score, and leaves `scored`.
--   Returns how many.
if ARGV[1] == 'forget' then
  local before = tonumber(ARGV[2])
  local entries = redis.call('HGETALL', KEYS[10])
  local n = 0
  for i = 1, #entries, 2 do
    local id, epoch = entries[i], tonumber(entries[i + 1])
    if epoch < before then
      if redis.call('HEXISTS', KEYS[5], id) == 1 then
        redis.call('HSET', KEYS[5], id, ARGV[3])
      end
      redis.call('ZADD', KEYS[4], 'XX', ARGV[3], id)
      redis.call('HDEL', KEYS[10], id)
      n = n + 1
    end
  end
  return n
end
local period = tonumber(ARGV[2])
if ARGV[1] == 'close' then
  local closed = tonumber(redis.call('GET', KEYS[1]) or '-1')
  if period > closed then
    redis.call('SET', KEYS[1], ARGV[2])
  end
  return {'ok'}
end
if not redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  return {}
end
local out = {}
local pos = 4
for _ = 1, tonumber(ARGV[3]) do
  local key, task, u, payload, epoch = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3],
    ARGV[pos + 4]
  pos = pos + 5
  if redis.call('SADD', KEYS[3], key) == 1 then
    redis.call('ZADD', KEYS[4], u, task)
    redis.call('HSET', KEYS[5], task, u)
    redis.call('HSET', KEYS[6], task, payload)
    if epoch ~= '' then
      redis.call('HSET', KEYS[10], task, epoch)
    end
    redis.call('HINCRBY', KEYS[7], 'released', 1)
    out[#out + 1] = task
  end
end
redis.call('DEL', KEYS[8], KEYS[9])
redis.call('ZREM', KEYS[2], ARGV[2])
return out
