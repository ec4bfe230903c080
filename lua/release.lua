-- Release: give back `tokens` unspent leased tokens to KEYS[1].
--
-- ARGV: algorithm (0 = token bucket, 1 = sliding window), count, period_ms,
-- capacity, tokens. A token bucket gains them back, clamped to capacity; a
-- sliding window takes them off the current window's count. A missing key
-- (expired: already full) is left alone, as is a key whose window has
-- turned since the tokens were taken. Reply: {0, remaining, reset_ms, 0}.

local algorithm = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)

if algorithm == 0 then
  local cap = capacity * period
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  local units, ts = tonumber(state[1]), tonumber(state[2])
  if units == nil or ts == nil then return {0, capacity, 0, 0} end
  if now > ts then
    units = units + (now - ts) * count
    ts = now
  end
  units = math.min(cap, units + tokens * period)
  redis.call('HSET', KEYS[1], 'tokens', units, 'ts', ts)
  return {0, idiv(units, period), idiv(cap - units + count - 1, count), 0}
end

local state = redis.call('HMGET', KEYS[1], 'win', 'cur', 'prev')
local win, cur = tonumber(state[1]), tonumber(state[2])
if win == nil or cur == nil then return {0, capacity, 0, 0} end
local start = now - now % period
if win ~= start then return {0, 0, math.max(win + period - now, 0), 0} end
redis.call('HSET', KEYS[1], 'cur', math.max(cur - tokens, 0))
return {0, 0, math.max(win + period - now, 0), 0}
