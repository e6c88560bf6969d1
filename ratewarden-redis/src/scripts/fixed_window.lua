-- Fixed window: hash {s = start, n = count}. Expiry is set once, when the
-- window opens; hits inside it only increment the count.
local v = redis.call('HMGET', key, 's', 'n')
local s0 = tonumber(v[1])
local start, count, open
-- A clock behind `start` stays inside the open window.
if s0 ~= nil and now < s0 + w then
  start = s0
  count = tonumber(v[2]) or 0
  open = false
else
  start = now
  count = 0
  open = true
end
local e = start + w
if penalize then
  local n = math.max(count, math.min(count + c, l))
  if open then
    redis.call('HSET', key, 's', num(start), 'n', num(n))
    redis.call('PEXPIRE', key, ttl(w))
  else
    redis.call('HSET', key, 'n', num(n))
  end
  return {0, 0, 0, 0}
end
if count + c <= l then
  if peek then
    -- nothing written
  elseif open then
    redis.call('HSET', key, 's', num(start), 'n', num(c))
    redis.call('PEXPIRE', key, ttl(w))
  else
    redis.call('HINCRBY', key, 'n', num(c))
  end
  return {1, l - count - c, sat(e - now), 0}
end
return {0, sat(l - count), sat(e - now), sat(e - now)}
