-- Lease the most uncertain tasks of an annotation queue to one annotator
-- (docs/ARCHITECTURE.md, "Annotation queues", step 4),
-- atomically, so two annotators never hold the same task. Expired leases go back to the pool
-- first.
-- KEYS[1] pool (zset: task id -> uncertainty), KEYS[2] leases (zset: task id -> expiry, ms),
-- KEYS[3] owners (hash: task id -> annotator key id), KEYS[4] scores (hash), KEYS[5] payloads
-- (hash), KEYS[6] the annotator's skipped tasks (set).
-- ARGV[1] now (ms), ARGV[2] lease TTL (ms), ARGV[3] n, ARGV[4] annotator, ARGV[5] how many
-- pool entries to look at past n (to pass over the annotator's skipped tasks).
-- Returns {requeued, id1, expiry1, payload1, uncertainty1, id2, ...}.
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  local score = redis.call('HGET', KEYS[4], id)
  if score then
    redis.call('ZADD', KEYS[1], score, id)
  end
end
local out = {#expired}
local n = tonumber(ARGV[3])
if n == 0 then
  return out
end
local until_ms = now + tonumber(ARGV[2])
local look = redis.call('ZREVRANGE', KEYS[1], 0, n + tonumber(ARGV[5]) - 1)
local taken = 0
for _, id in ipairs(look) do
  if taken >= n then break end
  if redis.call('SISMEMBER', KEYS[6], id) == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], until_ms, id)
    redis.call('HSET', KEYS[3], id, ARGV[4])
    out[#out + 1] = id
    out[#out + 1] = until_ms
    out[#out + 1] = redis.call('HGET', KEYS[5], id) or ''
    out[#out + 1] = redis.call('HGET', KEYS[4], id) or '0'
    taken = taken + 1
  end
end
return out
