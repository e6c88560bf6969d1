-- GCRA: only while the arrival time is still the one the admission set. A
-- later admission may have restarted the bucket from its own `now`,
-- absorbing these units; subtracting then would hand out free ones.
-- KEEPTTL (Redis 6+) leaves the expiry where the admission put it.
local T = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', key))
if tat == nil or tat ~= a then return 0 end
redis.call('SET', key, num(tat - c * T), 'KEEPTTL')
return 1
