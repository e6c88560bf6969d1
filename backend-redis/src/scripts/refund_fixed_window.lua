-- Fixed window: only the window the admission counted in, the one that
-- opened at a − W, holds its units; a later window never gives them back.
local v = redis.call('HMGET', key, 's', 'n')
local s0 = tonumber(v[1])
local n = tonumber(v[2]) or 0
if s0 == nil or s0 ~= a - w or n == 0 then return 0 end
redis.call('HSET', key, 'n', num(n - math.min(c, n)))
return 1
