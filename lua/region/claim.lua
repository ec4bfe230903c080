-- Claim: the one gateway of a region that sets KEYS[1] (for ARGV[1] ms)
-- asks the primary for a transfer for that key in that window.
-- Reply: {1 when this call set it, else 0, 0, 0, 0, 0}.
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return {1, 0, 0, 0, 0} end
return {0, 0, 0, 0, 0}
