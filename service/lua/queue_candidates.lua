-- Count one batch of candidates into the open release period of an annotation queue,
-- atomically (docs/ARCHITECTURE.md, "Annotation queues", steps 2-3).
-- Every candidate of the batch reaches this script, kept by β-sampling or not, and every one
-- costs the same commands on the same keys with arguments of the same lengths: SISMEMBER,
-- HINCRBY, HSET. The coin decides only values: a kept candidate of a key never released
-- counts 1 in its class (and, as the k-th of the period, writes its release blob), any other
-- counts 0 in a placeholder field and writes a placeholder of the blob's length. So neither
-- the response nor Redis's work depends on which candidates were kept (promise 5). A candidate
-- not kept arrives as placeholders of the same lengths (zeros), never as its digest or payload.
-- Each belongs to a class (its key, and for client-scored queues its uncertainty bucket), named
-- by the keyed digest of its canonical form; below k nothing else of a candidate is kept.
-- Periods are counted apart: a class is ready when k of its sampled candidates arrived in one
-- period, whatever other classes or other periods hold, and is released with the period
-- (queue_release.lua, which passes over the placeholder fields: they start with '~').
-- KEYS[1] stats (hash), KEYS[2] closed (string: the last period closed for release), KEYS[3]
-- periods (zset: periods holding counts), KEYS[4] released keys (set of key digests), KEYS[5]
-- the period's counts (hash: class -> sampled occurrences), KEYS[6] the period's ready classes
-- (hash: class -> release blob).
-- ARGV[1] k, ARGV[2] received (every candidate of the batch, for the stats), ARGV[3] period,
-- ARGV[4] n candidates; then per candidate: coin ('1' kept, '0' not), key digest, class,
-- release blob.
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
-- a field longer than hash-max-listpack-value (64 by default) makes both hashes hash tables
-- from their first batch on: a lookup then costs the same wherever the field is (a listpack
-- is scanned, so a class counted late would cost more than the placeholder counted first)
local wide = string.rep('~', 80)
redis.call('HSETNX', KEYS[5], wide, 0)
redis.call('HSETNX', KEYS[6], wide, '')
local pos = 5
for _ = 1, n do
  local coin, key, class, blob = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2], ARGV[pos + 3]
  pos = pos + 4
  local pad_field = string.rep('~', #class)
  local pad_blob = string.rep('\0', #blob)
  local fresh = redis.call('SISMEMBER', KEYS[4], key)
  local counts = (coin == '1' and fresh == 0) and 1 or 0
  local c = redis.call('HINCRBY', KEYS[5], counts == 1 and class or pad_field, counts)
  local ready = counts == 1 and c == k
  redis.call('HSET', KEYS[6], ready and class or pad_field, ready and blob or pad_blob)
end
return {'ok'}
