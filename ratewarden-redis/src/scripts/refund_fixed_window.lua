-- Fixed window: only the window the admission counted in, the one that
-- opened at a − W, holds its units; a later window never gives them back.
local v = redis.call('HMGET', key, 's', 'n')
local s0 = tonumber(v[1])
local n = tonumber(v[2]) or 0
if s0 == nil or s0 ~= a - w or n == 0 then return 0 end
-- A window holding nothing was opened by refunded requests only: without
-- them it would open at the next admission, not end early.
if n <= c then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'n', num(n - c))
end
return 1
