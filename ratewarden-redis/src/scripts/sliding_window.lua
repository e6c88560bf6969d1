-- Sliding window counter: hash {s = start, c = current, p = previous}, with
-- `start` a multiple of the window. A refusal writes nothing, not even the
-- roll-over to a new window.
local aligned = now - (now % w)
local v = redis.call('HMGET', key, 's', 'c', 'p')
local s0 = tonumber(v[1])
local c0 = tonumber(v[2]) or 0
local p0 = tonumber(v[3]) or 0
local start, cur, prev
local same = false
if s0 ~= nil and s0 >= aligned then
  -- A clock behind the stored window is clamped to its start.
  start, cur, prev = s0, c0, p0
  same = true
elseif s0 ~= nil and s0 + w == aligned then
  start, cur, prev = aligned, 0, c0
else
  start, cur, prev = aligned, 0, 0
end
if penalize then
  local n = math.max(cur, math.min(cur + c, l))
  if same then
    redis.call('HSET', key, 'c', num(n))
  else
    redis.call('HSET', key, 's', num(start), 'c', num(n), 'p', num(prev))
    redis.call('PEXPIRE', key, ttl(start + 2 * w - now))
  end
  return {0, 0, 0, 0}
end
local t = math.max(now, start)
local elapsed = t - start
local weighted = prev * (w - elapsed)
local lw = l * w
-- Rust's `weighted + (cur + c)·w ≤ l·w`, rearranged so that no operand
-- exceeds 2^53 where it could decide the outcome.
local allowed = (cur + c) * w <= lw - weighted
if allowed then cur = cur + c end
local rem = math.floor(sat(lw - weighted - cur * w) / w)
local eoc = start + w
local reset_at
if cur > 0 then
  reset_at = eoc + w
elseif prev > 0 then
  reset_at = eoc
else
  reset_at = t
end
local retry_at = now
if not allowed then
  retry_at = nil
  -- Later in this window, as the previous window's weight decays.
  if prev > 0 and cur + c <= l then
    local e = w - math.min(math.floor((l - cur - c) * w / prev), w)
    if e < w then retry_at = start + math.max(e, elapsed) end
  end
  -- In the next window, the current count becomes the previous one.
  if retry_at == nil then
    local e = 0
    if cur > 0 then e = w - math.min(math.floor((l - c) * w / cur), w) end
    retry_at = start + w + e
  end
end
if allowed and not peek then
  if same then
    redis.call('HINCRBY', key, 'c', num(c))
  else
    -- A window opens: the state is dead two windows after its start.
    redis.call('HSET', key, 's', num(start), 'c', num(cur), 'p', num(prev))
    redis.call('PEXPIRE', key, ttl(start + 2 * w - now))
  end
end
if allowed then
  return {1, rem, sat(reset_at - now), 0}
end
return {0, rem, sat(reset_at - now), sat(retry_at - now)}
