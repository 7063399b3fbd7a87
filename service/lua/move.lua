-- Move a staged value into place: RENAME KEYS[1] to KEYS[2] (O(1)), dropping the TTL the
-- staging key had (the destination keeps none). Atomic, and allowed on Redis Cluster (both keys
-- share a hash tag), where a RENAME in a pipeline is not. Returns 1.
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('PERSIST', KEYS[2])
return 1
