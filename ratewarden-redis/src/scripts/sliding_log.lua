-- Sliding log: a list of admitted units' timestamps, oldest first, at most
-- `limit` long. Expired entries are found by a binary search and trimmed on
-- every call, as the reference does: under a clock that went backwards,
-- entries expired at the latest time seen stay expired. A refusal records
-- nothing and never moves the expiry.
local n = redis.call('LLEN', key)
local newest = nil
if n > 0 then
  newest = tonumber(redis.call('LINDEX', key, -1))
end
-- Clamp a clock that went backwards to the newest entry.
local t = now
if newest ~= nil and newest > t then t = newest end
local lo, hi = 0, n
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  if tonumber(redis.call('LINDEX', key, mid)) + w <= t then
    lo = mid + 1
  else
    hi = mid
  end
end
local expired = lo
local count = n - expired
-- Where the live entries start in the list: a peek leaves the expired ones.
local base = 0
if expired > 0 then
  if peek then
    base = expired
  else
    redis.call('LTRIM', key, expired, -1)
  end
end
-- Appends `c` entries at `t`; the key lives exactly as long as its newest.
local function push()
  local ts = num(t)
  local left = c
  -- unpack() is bounded by Lua's C stack, so push in chunks.
  while left > 0 do
    local k = math.min(left, 1000)
    local args = {}
    for i = 1, k do args[i] = ts end
    redis.call('RPUSH', key, unpack(args))
    left = left - k
  end
  redis.call('PEXPIRE', key, ttl(t + w - now))
end
if penalize then
  -- What does not fit replaces the oldest entries: at most `l` are kept.
  push()
  if count + c > l then redis.call('LTRIM', key, -l, -1) end
  return {0, 0, 0, 0}
end
if count + c <= l then
  if peek then return {1, l - count - c, sat(t + w - now), 0} end
  push()
  return {1, l - count - c, sat(t + w - now), 0}
end
-- The (count + c - l)-th oldest live entry must expire first.
local freeing = tonumber(redis.call('LINDEX', key, base + count + c - l - 1))
if newest == nil then newest = t end
return {0, sat(l - count), sat(newest + w - now), sat(freeing + w - now)}
