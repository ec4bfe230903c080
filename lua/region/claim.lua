-- Claim: the one gateway of a region that sets KEYS[1] (for ARGV[1] ms)
-- asks the primary for a transfer for that key in that window. It also
-- marks the key's transfer as pending (KEYS[2], for ARGV[2] ms), which
-- credit.lua and unclaim.lua clear: while it stands, a gateway refused by
-- the bucket blocks the key only briefly, so credit that lands is spent at
-- once (spend_credit.lua says whether one is pending).
-- Reply: {1 when this call set it, else 0, 0, 0, 0, 0}.
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then
  redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  return {1, 0, 0, 0, 0}
end
return {0, 0, 0, 0, 0}
