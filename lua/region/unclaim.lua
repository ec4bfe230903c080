-- Unclaim: drops a key's rebalance claim (see claim.lua) after the asker
-- gave up, so the key may ask again. KEYS[1]: the claim.
-- Reply: {1 when there was a claim, else 0, 0, 0, 0, 0}.
return {redis.call('DEL', KEYS[1]), 0, 0, 0, 0}
