-- Release: give back `tokens` unspent leased tokens to KEYS[1].
--
-- ARGV: algorithm (0 = token bucket, 1 = sliding window, 2 = fixed window;
-- 4 and 5 = a fixed window on the calendar's weeks and months),
-- count, period_ms,
-- capacity, tokens, window_ms (the start of the window they were taken in;
-- 0 for a token bucket). A token bucket gains them back, clamped to
-- capacity. A sliding window takes them off the count of that window: the
-- current one if it still is, the previous one if it has turned once,
-- nothing if older. A fixed window takes them off its count while that
-- window is still the one counted. A missing key (expired: already full, or its windows
-- empty) is left alone. Clock steps back are handled as in the acquire
-- scripts. Reply: {0, remaining, reset_ms, 0, window_ms}.

local algorithm = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local window = tonumber(ARGV[6]) or 0

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)

if algorithm == 0 then
  local cap = capacity * period
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  local units, ts = tonumber(state[1]), tonumber(state[2])
  if units == nil or ts == nil then return {0, capacity, 0, 0, 0} end
  -- A clock that went back refills nothing and measures anew from now.
  if now > ts then units = units + (now - ts) * count end
  -- A level below zero is owed to reservations (token_bucket.lua): what
  -- comes back pays it off first. Never deeper than this quota allows.
  local debt_max = math.max(0, math.min(math.max(capacity, count), idiv(9007199254740992, period) - capacity))
  units = math.max(-debt_max * period, math.min(cap, units))
  units = math.min(cap, units + tokens * period)
  local reset = ceil_div(cap - units, count)
  redis.call('HSET', KEYS[1], 'tokens', units, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], reset + 1000)
  return {0, idiv(math.max(units, 0), period), reset, 0, 0}
end

-- window_of(now, p, cal): lua/calendar.lua, in front of this script.

local p = period
if algorithm == 2 or algorithm == 4 or algorithm == 5 then
  -- 4 and 5: a fixed window on the calendar's weeks and months.
  local cal = 0
  if algorithm >= 4 then cal = algorithm - 3 end
  local state = redis.call('HMGET', KEYS[1], 'win', 'n')
  local win, n = tonumber(state[1]), tonumber(state[2])
  if win == nil or n == nil then return {0, capacity, 0, 0, 0} end
  local start = window_of(now, p, cal)
  if win < start then return {0, capacity, 0, 0, 0} end -- it ended
  if win > start then win = start end -- from the future: re-anchored
  if window >= win then n = math.max(n - tokens, 0) end
  local _, ends = window_of(win, p, cal)
  local reset = math.max(ends - now, 1)
  redis.call('HSET', KEYS[1], 'win', win, 'n', n)
  redis.call('PEXPIRE', KEYS[1], reset)
  return {0, math.max(capacity - n, 0), reset, 0, win}
end

local state = redis.call('HMGET', KEYS[1], 'win', 'cur', 'prev')
local win, cur, prev = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if win == nil or cur == nil or prev == nil then return {0, capacity, 0, 0, 0} end
local start = now - now % p
if win < start then
  -- Turned: the overshoot carried, as sliding_window.lua rolls it.
  local turns = idiv(start - win, p)
  win, cur, prev = start, math.max(cur - capacity * turns, 0), math.min(math.max(cur - capacity * (turns - 1), 0), capacity)
elseif win > start then
  win, cur, prev = start, cur + prev, 0 -- from the future: re-anchored
end
if window >= win then
  cur = math.max(cur - tokens, 0)
elseif window + p == win then
  prev = math.max(prev - tokens, 0)
end
redis.call('HSET', KEYS[1], 'win', win, 'cur', cur, 'prev', prev)
local ends = win + p
if cur > 0 then ends = win + (2 + idiv(cur - 1, capacity)) * p end
redis.call('PEXPIRE', KEYS[1], math.max(ends - now, 1))
return {0, 0, math.max(win + p - now, 0), 0, win}
