-- One annotator's action on a leased task: heartbeat, skip or label. Atomic.
-- (docs/ARCHITECTURE.md, "Annotation queues", step 4.)
-- KEYS[1] pool, KEYS[2] leases, KEYS[3] owners, KEYS[4] scores, KEYS[5] payloads, KEYS[6]
-- labelled (hash: task id -> label), KEYS[7] stats, KEYS[8] the annotator's skipped set,
-- KEYS[9] labellers (hash: task id -> the annotator who labelled it).
-- ARGV[1] action, ARGV[2] task id, ARGV[3] annotator, ARGV[4] now (ms), ARGV[5] lease TTL
-- (ms) | label | skip-memory TTL (s).
-- A task is the annotator's while it holds the task's lease (live, or expired and not yet
-- taken back into the pool) and, once it labelled the task, for good. Only then does it hear
-- of the task's state. To anyone else the answer is {'missing'}, the same whether the task
-- does not exist, waits in the pool, is leased to another, or was labelled by another (with
-- whatever label).
-- Returns {status, ...}:
--   heartbeat: {'ok', expiry} | {'expired'} | {'labelled'} | {'missing'}
--   skip:      {'ok'} | {'expired'} | {'labelled'} | {'missing'}
--   label:     {'ok', payload} | {'dup', label, payload or ''} | {'missing'}
-- The first label is final; the labeller's repeat returns 'dup' with it (a replay).
local action, id, who, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local prev = redis.call('HGET', KEYS[6], id)
if prev then
  if redis.call('HGET', KEYS[9], id) ~= who then
    return {'missing'}
  end
  if action == 'label' then
    return {'dup', prev, redis.call('HGET', KEYS[5], id) or ''}
  end
  return {'labelled'}
end
if redis.call('HGET', KEYS[3], id) ~= who or redis.call('HEXISTS', KEYS[4], id) == 0 then
  return {'missing'}
end
local expiry = tonumber(redis.call('ZSCORE', KEYS[2], id) or '0')
local live = expiry > now
if action == 'label' then
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HSET', KEYS[6], id, ARGV[5])
  redis.call('HSET', KEYS[9], id, who)
  redis.call('HINCRBY', KEYS[7], 'labelled', 1)
  return {'ok', redis.call('HGET', KEYS[5], id) or ''}
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
