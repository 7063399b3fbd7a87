-- Reserve one of a key's creations of a kind (streams, queues) if it has fewer than its cap.
-- KEYS[1]: the counter. ARGV[1]: the cap.
-- Returns {1, count after} when reserved, {0, count} when the key is at its cap (nothing
-- changes then). The counter has no expiry: it counts what the key created.
local n = tonumber(redis.call('GET', KEYS[1]) or 0) or 0
if n >= tonumber(ARGV[1]) then
  return {0, n}
end
return {1, redis.call('INCR', KEYS[1])}
