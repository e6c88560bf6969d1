-- Shared prologue of every refund script. A transcription of
-- ratewarden_core::algorithm::refund, with header.lua's conventions: values
-- stay below 2^53 (the store checks the anchor, Policy the rest), so Lua's
-- doubles compare exactly what Rust compares.
--
-- KEYS[1] the key of one (algorithm, user key) pair, as the decision used
-- ARGV[1] anchor: the admission's now + reset_after (us)
-- ARGV[2] window (us)   ARGV[3] cost
-- ARGV[4] GCRA emission interval (us), GCRA only
-- Returns 1 if units were given back, 0 if the key held none of them.
--
-- A refund never creates a key and never touches a TTL: expiry belongs to
-- the admission that opened the state, and a refund must not be a way to
-- keep a key alive.
local key = KEYS[1]
local a = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local c = tonumber(ARGV[3])

-- Integers go to Redis as plain digits: tostring would switch to
-- scientific notation for timestamps.
local function num(x)
  return string.format('%.0f', x)
end
