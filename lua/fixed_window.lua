-- Fixed-window acquire: give back unspent requests' worth, then take up to
-- `want` at KEYS[1], in one atomic step.
--
-- ARGV: limit, period_ms, want, give_back, give_back_window, calendar,
-- charge, need. At
-- most `limit` requests per window, windows aligned to multiples of the
-- period since the epoch (envoyproxy/ratelimit's counting: a day resets at
-- 00:00 UTC), or with `calendar` 1 or 2 to the UTC calendar's weeks
-- (Monday 00:00) or months (the 1st 00:00). `give_back` (unspent leased requests, 0 for none) comes off the
-- count only while `give_back_window` (the start of the window they were
-- taken in) is still the window counted. Refused requests are not counted.
-- This is src/quota/fixed_window.rs on Redis; time is Redis's own clock.
--
-- `charge` (costs settled above their reserve) is counted after the
-- give-back whether it fits or not: the count may pass the limit, and what
-- passes it is not forgiven when the window ends: each window that turns
-- pays off `limit` of it, the rest counted in the next (a debt carried).
-- Nothing is granted unless `need` fit (the asking request's reserve; 0
-- and 1: any); then retry_after_ms is the wait for the next window.
--
-- State: hash {win = start of the window counted, in ms, n = its count}.
-- Reply: {granted, remaining, reset_ms, retry_after_ms, window_ms, 0,
-- owed}; retry_after_ms is the wait until the next window whenever nothing
-- more fits after this grant, or `need` did not, else 0; owed is the count
-- above the limit.

local limit = tonumber(ARGV[1])
local p = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local give_back = tonumber(ARGV[4]) or 0
local give_back_window = tonumber(ARGV[5]) or 0
local calendar = tonumber(ARGV[6]) or 0
local charge = tonumber(ARGV[7]) or 0
local need = tonumber(ARGV[8]) or 1

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- window_of(now, p, cal), turns_of(from, to, p, cal), longest(p, cal):
-- lua/calendar.lua, in front of this script.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
local start, finish = window_of(now, p, calendar)

local state = redis.call('HMGET', KEYS[1], 'win', 'n')
local win, n = tonumber(state[1]), tonumber(state[2])
if win == nil or n == nil then
  redis.call('DEL', KEYS[1]) -- new, expired, or another algorithm's hash
  win, n = start, 0
elseif win < start then
  -- Turned: `limit` of an overshoot paid off by each window.
  n = math.max(n - limit * turns_of(win, start, p, calendar), 0)
  win = start
elseif win > start then
  -- A window from the future: the clock went back. Re-anchored to now's
  -- window with its count: no stall beyond one period, no over-admission.
  win = start
end

if give_back > 0 and give_back_window >= win then
  n = math.max(n - give_back, 0)
end

n = n + charge

local granted = 0
if math.max(limit - n, 0) >= need then granted = math.min(want, math.max(limit - n, 0)) end
n = n + granted
local remaining = math.max(limit - n, 0)
local _, ends = window_of(win, p, calendar)
local reset = math.max(ends - now, 1)

redis.call('HSET', KEYS[1], 'win', win, 'n', n)
-- Kept to the window's end, and a window more for each limit owed.
local keep = reset
if n > limit then keep = reset + idiv(n - 1, limit) * longest(p, calendar) end
redis.call('PEXPIRE', KEYS[1], keep)
local retry = 0
if remaining == 0 or (granted == 0 and want > 0 and remaining < need) then retry = reset end
return {granted, remaining, reset, retry, win, 0, math.max(n - limit, 0)}
