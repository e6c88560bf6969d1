-- Shared prologue of every limiter script. A transcription of
-- ratewarden-core/src/algorithm.rs: all values stay below 2^53 (Policy
-- validation guarantees it), so Lua's doubles compute exactly what Rust does.
--
-- KEYS[1] the key of one (algorithm, user key) pair
-- ARGV[1] now in microseconds, or 'server' to read the server's clock
-- ARGV[2] limit   ARGV[3] window (us)   ARGV[4] cost   ARGV[5] expiry margin (ms)
-- ARGV[6] GCRA emission interval (us), GCRA only (any number otherwise)
-- ARGV[7] 'peek' to answer what the request would get and write nothing, or
--         'penalize' to record the units whether or not they fit, within
--         algorithm::penalize's bounds; its reply is not read
-- Returns {allowed (0|1), remaining, reset_after_us, retry_after_us}.
local key = KEYS[1]
local now
if ARGV[1] == 'server' then
  -- Redis < 5 replicates scripts verbatim and refuses writes after TIME
  -- unless effects replication is switched on; Redis 5+ does it already.
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local l = tonumber(ARGV[2])
local w = tonumber(ARGV[3])
local c = tonumber(ARGV[4])
local margin = tonumber(ARGV[5])
-- A peek runs the same decision and skips every write, so that it cannot
-- drift from what a request gets.
local peek = ARGV[7] == 'peek'
local penalize = ARGV[7] == 'penalize'

-- Integers go to Redis as plain digits: tostring would switch to
-- scientific notation for timestamps.
local function num(x)
  return string.format('%.0f', x)
end

-- A TTL in whole milliseconds for state that is dead `us` from now; the
-- margin keeps expiry a garbage collector, never the decision.
local function ttl(us)
  return num(math.ceil(us / 1000) + margin)
end

local function sat(x)
  if x < 0 then return 0 end
  return x
end
