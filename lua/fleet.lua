-- The fleet's heartbeats: which instances share this store, and how many.
--
-- KEYS[1]: a sorted set of members, each scored by when its heartbeat
-- expires (ms, on Redis's clock). ARGV: member, ttl_ms.
--
-- Adds or refreshes the member for ttl_ms (0: removes it, an instance
-- leaving), drops every member whose heartbeat has expired, and keeps the
-- set twice as long as a heartbeat lives, so a fleet that is gone leaves
-- nothing behind. Reply: {live members, 0, 0, 0, 0}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
-- A member leaving does not shorten the set's life: the others renew it.
if live > 0 and ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
return {live, 0, 0, 0, 0}
