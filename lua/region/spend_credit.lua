-- Spend credit: takes up to `want` tokens from a key's unexpired credit
-- (see credit.lua), the batch that expires first first, and drops expired
-- batches. KEYS[1]: the credit hash; KEYS[2]: the key's pending mark
-- (claim.lua); KEYS[3]: the region's shortfall of the key, tokens asked
-- for and found neither in the bucket nor in credit, counted for one
-- period (ARGV[2], ms) from its last increase. ARGV: want, period_ms.
-- Reply: {spent, credit left, 1 when a transfer is pending else 0,
-- shortfall, 0}.

local want = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local flat = redis.call('HGETALL', KEYS[1])
local batches = {}
for i = 1, #flat, 2 do
  local expires, tokens = tonumber(flat[i]), tonumber(flat[i + 1])
  if expires == nil or tokens == nil or expires <= now or tokens <= 0 then
    redis.call('HDEL', KEYS[1], flat[i])
  else
    table.insert(batches, {expires, tokens, flat[i]})
  end
end
table.sort(batches, function(a, b) return a[1] < b[1] end)

local spent, left = 0, 0
for _, b in ipairs(batches) do
  local take = math.min(want - spent, b[2])
  spent = spent + take
  if take == b[2] then
    redis.call('HDEL', KEYS[1], b[3])
  elseif take > 0 then
    redis.call('HINCRBY', KEYS[1], b[3], 0 - take)
    left = left + b[2] - take
  else
    -- Nothing taken (want already met): untouched. (HINCRBY by -0 is an
    -- error: Lua writes it "-0".)
    left = left + b[2]
  end
end
local short = tonumber(redis.call('GET', KEYS[3]) or '0')
if spent < want then
  short = redis.call('INCRBY', KEYS[3], want - spent)
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]))
end
return {spent, left, redis.call('EXISTS', KEYS[2]), short, 0}
