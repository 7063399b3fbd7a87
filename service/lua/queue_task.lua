-- One annotator's action on a leased task: heartbeat, skip or label. Atomic.
-- (docs/ARCHITECTURE.md, "Annotation queues", step 4.)
-- KEYS[1] pool, KEYS[2] leases, KEYS[3] owners, KEYS[4] scores, KEYS[5] payloads, KEYS[6]
-- labelled (hash: task id -> label), KEYS[7] stats, KEYS[8] the annotator's skipped set.
-- ARGV[1] action, ARGV[2] task id, ARGV[3] annotator, ARGV[4] now (ms), ARGV[5] lease TTL
-- (ms) | label | skip-memory TTL (s).
-- Returns {status, ...}:
--   heartbeat: {'ok', expiry} | {'expired'} | {'other'} | {'missing'} | {'labelled'}
--   skip:      {'ok'} | {'expired'} | {'other'} | {'missing'} | {'labelled'}
--   label:     {'ok', payload} | {'dup', label, payload or ''} | {'other'} | {'missing'}
-- A label is accepted from anyone but the holder of another annotator's live lease; the first
-- label is final (a repeat returns 'dup' with it).
local action, id, who, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local prev = redis.call('HGET', KEYS[6], id)
if prev then
  if action == 'label' then
    return {'dup', prev, redis.call('HGET', KEYS[5], id) or ''}
  end
  return {'labelled'}
end
if redis.call('HEXISTS', KEYS[4], id) == 0 then
  return {'missing'}
end
local owner = redis.call('HGET', KEYS[3], id)
local expiry = tonumber(redis.call('ZSCORE', KEYS[2], id) or '0')
local live = owner and expiry > now
if action == 'label' then
  if live and owner ~= who then
    return {'other'}
  end
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HSET', KEYS[6], id, ARGV[5])
  redis.call('HINCRBY', KEYS[7], 'labelled', 1)
  return {'ok', redis.call('HGET', KEYS[5], id) or ''}
end
if owner ~= who then
  return {'other'}
end
if not live then
  return {'expired'}
end
if action == 'heartbeat' then
  local until_ms = now + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[2], 'XX', until_ms, id)
  return {'ok', until_ms}
end
-- skip: back to the pool, and not offered to this annotator again for a while
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[4], id), id)
redis.call('SADD', KEYS[8], id)
redis.call('EXPIRE', KEYS[8], tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[7], 'skipped', 1)
return {'ok'}
