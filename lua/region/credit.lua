-- Credit (the requesting region's side of a transfer): adds tokens another
-- region granted to a key, for as long as the window they were granted
-- for, once per transfer.
--
-- KEYS[1]: the key's credit, a hash {expiry ms on Redis's clock = tokens};
-- KEYS[2]: the marker of this transfer; KEYS[3]: the key's pending mark
-- (claim.lua), cleared: the transfer is settled, credited or not (a
-- refusal credits 0 tokens). ARGV: tokens, ttl_ms.
-- Reply: {credited (0 when this transfer was credited before), 0, 0, 0, 0}.

redis.call('DEL', KEYS[3])

local tokens = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', ttl) then return {0, 0, 0, 0, 0} end
if tokens <= 0 then return {0, 0, 0, 0, 0} end
redis.call('HINCRBY', KEYS[1], now + ttl, tokens)
-- The hash lives as long as its latest batch; older batches are dropped
-- by the spend script once their time is up.
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return {tokens, 0, 0, 0, 0}
