-- A token bucket per (API key, endpoint class), as GCRA (the generic cell rate algorithm):
-- the bucket is one number, its theoretical arrival time (TAT) in microseconds, which is
-- `now` when the bucket is full and moves `interval` later with each request admitted.
-- KEYS[1]: the bucket. ARGV[1]: microseconds between tokens (the refill interval, >= 1).
-- ARGV[2]: the bucket's capacity (the burst, >= 1).
-- Returns 0 when the request is admitted (and takes a token), else the microseconds until
-- one would be (nothing is written then). The clock is Redis's, so every API process
-- shares it; the key expires when the bucket is full again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now) or now
if tat < now then
  tat = now
end
local over = (tat - now) - interval * (burst - 1)
if over > 0 then
  return over
end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX',
  math.floor((tat - now) / 1000) + 1)
return 0
