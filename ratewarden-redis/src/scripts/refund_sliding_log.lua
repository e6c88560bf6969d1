-- Sliding log: the admission appended `c` entries equal to a − W. The list
-- is sorted, so those are one run; LREM from the tail removes up to `c` of
-- them and nothing else. Redis deletes a list that LREM empties.
local removed = redis.call('LREM', key, -c, num(a - w))
if removed > 0 then return 1 end
return 0
