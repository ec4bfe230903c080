-- Sliding-window acquire: give back unspent requests' worth, then take up
-- to `want` at KEYS[1], in one atomic step.
--
-- ARGV: limit, period_ms, want, give_back, give_back_window, charge,
-- need. At most
-- `limit` requests per period over a weighted sliding window: the previous
-- aligned window counts in proportion to how much of it the sliding window
-- still covers. `give_back` (unspent leased requests, 0 for none) goes back
-- first to the window they were taken in (`give_back_window`, its start):
-- off the current count if that is still the current window, off the
-- previous count if it has turned once, nowhere if older. This is
-- src/quota/sliding_window.rs on Redis: windows aligned to multiples of the
-- period since the epoch, estimates scaled by period_ms, integer math
-- (exact in doubles below 2^53). Time is Redis's own clock.
--
-- `charge` (costs settled above their reserve) is counted in the current
-- window after the give-back, whether it fits or not. A current count
-- above the limit is not forgiven when the window turns: the next window's
-- previous count is the limit, its current count the overshoot, `limit`
-- paid off by each window that turns. Nothing is granted
-- unless `need` fit (the asking request's reserve; 0 and 1: any); then
-- retry_after_ms is the exact wait until they do.
--
-- State: hash {win = start of the current window in ms, cur, prev}.
-- Reply: {granted, remaining, reset_ms, retry_after_ms, window_ms, 0,
-- owed}; retry_after_ms is the exact wait until one more request fits
-- whenever none does after this grant (granted or not), or until `need`
-- do when they did not, else 0; window_ms is the start of the window the
-- grant was counted in; owed is the estimate above the limit.

local limit = tonumber(ARGV[1])
local p = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local give_back = tonumber(ARGV[4]) or 0
local give_back_window = tonumber(ARGV[5]) or 0
local charge = tonumber(ARGV[6]) or 0
local need = tonumber(ARGV[7]) or 1

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
local start = now - now % p

local state = redis.call('HMGET', KEYS[1], 'win', 'cur', 'prev')
local win, cur, prev = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if win == nil or cur == nil or prev == nil then
  redis.call('DEL', KEYS[1]) -- new, expired, or another algorithm's hash
  win, cur, prev = start, 0, 0
elseif win < start then
  -- Turned `turns` times: what was left of the count a window before now
  -- (at most the limit) is the previous count, the rest the current one.
  local turns = idiv(start - win, p)
  win, cur, prev = start, math.max(cur - limit * turns, 0), math.min(math.max(cur - limit * (turns - 1), 0), limit)
elseif win > start then
  -- A window from the future: the clock went back (a failover to a skewed
  -- replica). Re-anchored to now's window rather than kept until the clock
  -- catches up; both counts go to the current window, where they weigh
  -- fully, so no step back lowers the estimate.
  win, cur, prev = start, cur + prev, 0
end

if give_back > 0 then
  if give_back_window >= win then
    cur = math.max(cur - give_back, 0)
  elseif give_back_window + p == win then
    prev = math.max(prev - give_back, 0)
  end
end

cur = cur + charge

-- Scaled estimate of the requests in the sliding window ending now.
local into = math.min(math.max(now - win, 0), p)
local function estimate() return prev * (p - into) + cur * p end

local budget = limit * p
local fits = idiv(math.max(budget - estimate(), 0), p)
local granted = 0
if fits >= need then granted = math.min(want, fits) end
cur = cur + granted
local remaining = idiv(math.max(budget - estimate(), 0), p)

-- The milliseconds until k more requests' worth fit (1 <= k <= limit).
local function retry_after(k)
  k = math.max(1, math.min(k, limit))
  if cur + k <= limit then
    -- Later in this window: prev * (p - e) <= (limit - k - cur) * p.
    if prev == 0 then return 1 end
    local e = math.max(p - idiv((limit - k - cur) * p, prev), 0)
    if e < p then return math.max(e - into, 1) end
  end
  -- A later window j (1 = the next): the first whose current count (the
  -- overshoot left, `limit` paid off by each) leaves room for k; in it,
  -- prev * (p - e) <= (limit - k - cur_j) * p.
  local j = math.max(1, idiv(math.max(cur - limit, 0) + k + limit - 1, limit))
  local cur_j = math.max(cur - limit * j, 0)
  local prev_j = math.min(math.max(cur - limit * (j - 1), 0), limit)
  local e = 0
  if prev_j > 0 then e = math.max(p - idiv((limit - k - cur_j) * p, prev_j), 0) end
  return (p - into) + (j - 1) * p + e
end

redis.call('HSET', KEYS[1], 'win', win, 'cur', cur, 'prev', prev)
-- Forgetting the state changes nothing once every request it counts has
-- left the sliding window: two windows on, or one if this one counts none.
local ends = win + p
-- An overshoot lasts a window more for each limit it holds.
if cur > 0 then ends = win + (2 + idiv(cur - 1, limit)) * p end
redis.call('PEXPIRE', KEYS[1], math.max(ends - now, 1))
local retry = 0
if granted == 0 and want > 0 and need > 1 and remaining < need then
  retry = retry_after(need)
elseif remaining == 0 then
  retry = retry_after(1)
end
local owed = math.max(estimate() - budget, 0)
return {granted, remaining, math.max(win + p - now, 0), retry, win, 0, idiv(owed + p - 1, p)}
