-- RLQS demand shared by a fleet: each stream's demand for one bucket, and
-- its max-min fair share of the bucket's rate among every stream heard.
--
-- KEYS[1]: a hash of member -> "demand:expires_ms" (demands in thousandths
-- of a request per second; expiry on Redis's clock).
-- ARGV: member, demand, rate (thousandths per second), ttl_ms.
--
-- Records the member's demand for ttl_ms, drops the expired ones, and
-- answers the member's share: a stream that wants less than an equal split
-- of what is left gets what it wants, the others split the rest equally.
-- The shares of all members add up to at most the rate. The hash lives two
-- ttls, so the demands of an instance that died leave nothing behind.
-- Reply: {share, streams heard, 0, 0, 0, 0}.
--
-- A ttl_ms of 0 is a stream that ended: its demand is deleted at once (the
-- hash with the last), so the others get its share at their next report;
-- reply {0, streams left, 0, 0, 0, 0}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local own = tonumber(ARGV[2])
local ttl = tonumber(ARGV[4])
if ttl == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return {0, redis.call('HLEN', KEYS[1]), 0, 0, 0, 0}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local demands = {}
for i = 1, #all, 2 do
  local d, expires = string.match(all[i + 1], '^(%d+):(%d+)$')
  if d == nil or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    demands[#demands + 1] = tonumber(d)
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
table.sort(demands)
local left = tonumber(ARGV[3])
local n = #demands
local share = own
for _, d in ipairs(demands) do
  local equal = left / n
  if d >= equal then
    if own >= equal then share = equal end
    break
  end
  if d == own then break end
  left = left - d
  n = n - 1
end
return {math.floor(share), #demands, 0, 0, 0, 0}
