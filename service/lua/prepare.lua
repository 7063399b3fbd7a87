-- Write a window's noise-initialised tables unless the window is already open or closed
-- (so a late or duplicate preparation can never overwrite tables that hold data).
-- KEYS[1] meta hash, KEYS[2..] tables; ARGV[i] the int32 big-endian cells of KEYS[i+1];
-- ARGV[#KEYS] the state to set ('prepared' or 'open').
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'open' or state == 'closed' then
  return 0
end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i - 1])
end
redis.call('HSET', KEYS[1], 'state', ARGV[#KEYS])
return 1
