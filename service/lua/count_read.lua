-- Read a window's counting checkpoint and some of its tables together (count.lua writes them
-- together): what counting up to that checkpoint left in the tables.
-- KEYS[1] meta hash, KEYS[2..] tables. Returns {checkpoint or '', table or false, ...}.
local out = {redis.call('HGET', KEYS[1], 'counted') or ''}
for i = 2, #KEYS do
  out[i] = redis.call('GET', KEYS[i])
end
return out
