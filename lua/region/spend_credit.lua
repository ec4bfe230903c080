-- Spend credit: takes up to `want` tokens from a key's unexpired credit
-- (see credit.lua), the batch that expires first first, and drops expired
-- batches. KEYS[1]: the credit hash. ARGV: want.
-- Reply: {spent, credit left, 0, 0, 0}.

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
return {spent, left, 0, 0, 0}
