-- Count the sampled candidates of one batch into the open release period of an annotation
-- queue, atomically (docs/ARCHITECTURE.md, "Annotation queues", steps 2-3).
-- Only candidates kept by β-sampling reach this script. Each belongs to a class (its key, and
-- for client-scored queues its uncertainty bucket), named by the keyed digest of its canonical
-- form; below k nothing else of a candidate is kept. Periods are counted apart: a class is
-- ready when k of its sampled candidates arrived in one period, whatever other classes or
-- other periods hold, and is released with the period (queue_release.lua).
-- KEYS[1] stats (hash), KEYS[2] closed (string: the last period closed for release), KEYS[3]
-- periods (zset: periods holding counts), KEYS[4] released keys (set of key digests), KEYS[5]
-- the period's counts (hash: class -> sampled occurrences), KEYS[6] the period's ready classes
-- (hash: class -> release blob).
-- ARGV[1] k, ARGV[2] received (every candidate of the batch, for the stats), ARGV[3] period,
-- ARGV[4] n sampled; then per sampled candidate: key digest, class, release blob.
-- Returns {'closed', last closed period} when the period is closed already (nothing written:
-- the caller counts the batch into a later period) or {'ok'}.
local period = tonumber(ARGV[3])
local closed = tonumber(redis.call('GET', KEYS[2]) or '-1')
if period <= closed then
  return {'closed', closed}
end
local k = tonumber(ARGV[1])
local n = tonumber(ARGV[4])
redis.call('HINCRBY', KEYS[1], 'received', tonumber(ARGV[2]))
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
local pos = 5
for _ = 1, n do
  local key, class, blob = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2]
  pos = pos + 3
  if redis.call('SISMEMBER', KEYS[4], key) == 0 then
    if redis.call('HINCRBY', KEYS[5], class, 1) == k then
      redis.call('HSET', KEYS[6], class, blob)
    end
  end
end
return {'ok'}
