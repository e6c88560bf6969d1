-- GCRA: the theoretical arrival time as a string. The state is dead at
-- `tat`, which only an admitted request moves.
local T = tonumber(ARGV[6])
local stored = tonumber(redis.call('GET', key))
local tat = now
if stored ~= nil and stored > now then tat = stored end
local burst = l * T
local new_tat = tat + c * T
if penalize then
  -- A full bucket and one window more, less one unit: a wait of at most w.
  local capped = math.max(tat, math.min(new_tat, now + burst + w - T))
  redis.call('SET', key, num(capped), 'PX', ttl(capped - now))
  return {0, 0, 0, 0}
end
if new_tat - now <= burst then
  if not peek then
    redis.call('SET', key, num(new_tat), 'PX', ttl(new_tat - now))
  end
  return {1, math.floor((burst - (new_tat - now)) / T), new_tat - now, 0}
end
return {0, math.floor(sat(burst - (tat - now)) / T), tat - now, new_tat - burst - now}
