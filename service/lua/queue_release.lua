-- Close, then release, one period of an annotation queue, atomically per call
-- (docs/ARCHITECTURE.md, "Annotation queues", step 3).
-- KEYS[1] closed (string), KEYS[2] periods (zset), KEYS[3] released keys (set of key digests),
-- KEYS[4] pool (zset: task id -> uncertainty), KEYS[5] scores (hash: task id -> uncertainty),
-- KEYS[6] payloads (hash: task id -> JSON), KEYS[7] stats, KEYS[8] the period's counts,
-- KEYS[9] the period's ready classes.
-- ARGV[1] 'close' | 'release', ARGV[2] period.
-- 'close': no batch is counted into this period or an earlier one from now on
--   (queue_candidates.lua answers 'closed'), so its ready classes are final. Returns {'ok'}.
-- 'release': ARGV[3] n, then per task: key digest, task id, uncertainty, payload JSON. Runs
--   once per period (a period no longer in `periods` is done: returns {}): each task whose key
--   was never released enters the pool; the period's counts and ready classes are deleted.
--   Returns the released task ids.
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
  local key, task, u, payload = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3]
  pos = pos + 4
  if redis.call('SADD', KEYS[3], key) == 1 then
    redis.call('ZADD', KEYS[4], u, task)
    redis.call('HSET', KEYS[5], task, u)
    redis.call('HSET', KEYS[6], task, payload)
    redis.call('HINCRBY', KEYS[7], 'released', 1)
    out[#out + 1] = task
  end
end
redis.call('DEL', KEYS[8], KEYS[9])
redis.call('ZREM', KEYS[2], ARGV[2])
return out
