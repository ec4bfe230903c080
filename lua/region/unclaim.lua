-- Unclaim: drops a key's rebalance claim (see claim.lua) after the asker
-- gave up, so the key may ask again, and its pending mark. KEYS[1]: the
-- claim; KEYS[2]: the pending mark.
-- Reply: {1 when there was a claim, else 0, 0, 0, 0, 0}.
redis.call('DEL', KEYS[2])
return {redis.call('DEL', KEYS[1]), 0, 0, 0, 0}
