
-- The policy's ban, around the algorithm's verdict above: a transcription
-- of ratewarden-core/src/ban.rs.
--
-- KEYS[2] the key's ban record, in KEYS[1]'s slot: hash {u = banned until,
--         o = offences, s = the breach window's start, n = breaches}
-- ARGV[8] refusals that ban   ARGV[9] their window (us)   ARGV[10] first
-- ban (us)   ARGV[11] growth factor   ARGV[12] longest ban (us)
-- Returns the verdict and a fifth integer, 1 for a ban's refusal.
local bkey = KEYS[2]
local b = redis.call('HMGET', bkey, 'u', 'o', 's', 'n')
local untl = tonumber(b[1]) or 0
-- Banned: refused, and nothing written, so that a ban never extends itself.
if now < untl then
  return {0, 0, untl - now, untl - now, 1}
end
local r = verdict()
if r[1] == 1 or peek or penalize then
  r[5] = 0
  return r
end
local after = tonumber(ARGV[8])
local within = tonumber(ARGV[9])
local block = tonumber(ARGV[10])
local factor = tonumber(ARGV[11])
local cap = tonumber(ARGV[12])
local offences = tonumber(b[2]) or 0
local start = tonumber(b[3]) or 0
local breaches = tonumber(b[4]) or 0
if (offences > 0 or untl > 0) and now >= untl + cap then
  offences = 0
  untl = 0
end
if breaches > 0 and now >= start + within then
  breaches = 0
end
if breaches == 0 then
  start = now
end
breaches = breaches + 1
local banned = 0
if breaches >= after then
  local length = block
  local i = 0
  while i < offences and factor > 1 and length < cap do
    length = length * factor
    i = i + 1
  end
  if length > cap then length = cap end
  untl = now + length
  offences = math.min(offences + 1, 64)
  breaches = 0
  r = {0, 0, length, length}
  banned = 1
end
redis.call('HSET', bkey, 'u', num(untl), 'o', num(offences), 's', num(start), 'n', num(breaches))
local e = 0
if breaches > 0 then e = start + within end
if offences > 0 or untl > 0 then e = math.max(e, untl + cap) end
redis.call('PEXPIRE', bkey, ttl(e - now))
r[5] = banned
return r
