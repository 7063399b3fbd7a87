-- Read one chunk of a window's hot stream for the train set: only the entries' raw rows, as
-- one string, so that the client parses a whole chunk with one call instead of building a
-- reply object per entry.
-- KEYS[1] hot stream; ARGV[1] start id (or '(' id: exclusive), ARGV[2] end id, ARGV[3] count.
-- Returns {} when the range is empty, else {last entry id, number of entries, 'row,row,...'}:
-- each row is the entry's 'd' field (a JSON object), so the string is a JSON array's inside.
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local n = #entries
if n == 0 then
  return {}
end
local rows = {}
for i = 1, n do
  local fields = entries[i][2]
  for j = 1, #fields, 2 do
    if fields[j] == 'd' then
      rows[i] = fields[j + 1]
      break
    end
  end
  if rows[i] == nil then
    return redis.error_reply('hot stream entry ' .. entries[i][1] .. ' has no d field')
  end
end
return {entries[n][1], n, table.concat(rows, ',')}
