-- Sliding window counter: the admission counted in the window starting at
-- s = a − 2W. Its units are `current` while that window is the stored one
-- and `previous` after one roll-over; any other window never held them.
local v = redis.call('HMGET', key, 's', 'c', 'p')
local s0 = tonumber(v[1])
if s0 == nil then return 0 end
local s = a - 2 * w
local field, units
if s0 == s then
  field, units = 'c', tonumber(v[2]) or 0
elseif s0 == s + w then
  field, units = 'p', tonumber(v[3]) or 0
else
  return 0
end
if units == 0 then return 0 end
redis.call('HSET', key, field, num(units - math.min(c, units)))
return 1
