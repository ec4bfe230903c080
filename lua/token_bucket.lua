-- Token bucket acquire: give back unspent tokens, then take up to `want`
-- tokens from the bucket at KEYS[1], in one atomic step.
--
-- ARGV: count, period_ms, capacity, want, give_back, reserve, charge, need.
-- The bucket gains
-- `count` tokens per `period_ms`, up to `capacity`. `give_back` (unspent
-- leased tokens, 0 for none) goes back first, clamped to the capacity. This
-- is src/quota/token_bucket.rs on Redis: integer math, the level kept in
-- units where one token is period_ms units and each millisecond adds
-- `count` units (every value stays below 2^53, so doubles are exact). Time
-- is Redis's own clock.
--
-- With `reserve` = 1 and no whole token to grant, up to `want` tokens of
-- the refill to come are reserved instead (GCRA-style): taken now, so the
-- level goes below zero (a debt the refill pays off before anyone else
-- gets a token), and spendable by the caller one by one as the refill
-- brings them, the first after retry_after_ms. The debt stays within
-- max(capacity, count) tokens (and within 2^53 units all told, so doubles
-- stay exact): a reservation is cut to what fits, and when nothing fits
-- none is made.
--
-- `charge` (costs settled above their reserve, 0 for none) is taken after
-- the give-back whether the bucket has it or not: the level goes below
-- zero by all of it (a debt is never forgiven), bounded only by what keeps
-- every level within 2^53 units (charged_max below). Nothing is granted unless
-- `need` whole tokens are there (the asking request's reserve; 0 and 1:
-- any), and then retry_after_ms is the exact wait until they are.
--
-- State: hash {tokens = level in units (negative while reservations are
-- owed), ts = when measured, in ms}. A missing key is a full bucket.
-- Reply: {granted, remaining, reset_ms, retry_after_ms, window_ms,
-- reserved, owed}; owed is the whole tokens below zero; retry_after_ms is the exact wait for one whole token whenever
-- none is left after this grant (granted or not), else 0; window_ms is
-- always 0.

local count = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local give_back = tonumber(ARGV[5]) or 0
local reserve = tonumber(ARGV[6]) or 0
local charge = tonumber(ARGV[7]) or 0
local need = tonumber(ARGV[8]) or 1

-- floor(a / b) for integers below 2^53, corrected for rounding.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b) return idiv(a + b - 1, b) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
local cap = capacity * period
-- The most tokens reservations may owe: one burst or one period's count,
-- and no more than keeps every level within 2^53 units.
local charged_max = math.max(0, idiv(9007199254740992, period) - capacity)
local debt_max = math.min(math.max(capacity, count), charged_max)

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local units, ts = tonumber(state[1]), tonumber(state[2])
if units == nil or ts == nil then
  -- New, expired, or a hash of another algorithm: start full and clean.
  redis.call('DEL', KEYS[1])
  units = cap
else
  -- Refill for the time elapsed. A clock that went back (a failover to a
  -- skewed replica) refills nothing, and the level is measured anew at the
  -- earlier time: refills resume from there, not once the clock has caught
  -- up with the old ts. Capped at the capacity in force, which a reload
  -- may have lowered.
  if now > ts then units = units + (now - ts) * count end
  -- A debt is kept whole (only the doubles' bound cuts it); a level above
  -- the capacity (a reload lowered it) is cut.
  units = math.max(-charged_max * period, math.min(cap, units))
end
ts = now
if give_back > 0 then units = math.min(cap, units + give_back * period) end
if charge > 0 then units = math.max(-charged_max * period, units - charge * period) end

local granted = 0
if units > 0 and idiv(units, period) >= need then granted = math.min(want, idiv(units, period)) end
units = units - granted * period
local retry_after = 0
if granted == 0 and need > 1 and want > 0 then
  if units < need * period then retry_after = ceil_div(need * period - units, count) end
elseif units < period then
  retry_after = ceil_div(period - units, count)
end
local reserved = 0
if reserve == 1 and granted == 0 and want > 0 then
  local floor = -debt_max * period
  if units > floor then reserved = math.min(want, idiv(units - floor, period)) end
  units = units - reserved * period
end
local reset = ceil_div(cap - units, count)
local remaining = 0
if units > 0 then remaining = idiv(units, period) end
local owed = 0
if units < 0 then owed = ceil_div(-units, period) end

redis.call('HSET', KEYS[1], 'tokens', units, 'ts', ts)
-- Full again after `reset` ms, and a missing key is a full bucket: keep the
-- state that long, and a second more.
redis.call('PEXPIRE', KEYS[1], reset + 1000)
return {granted, remaining, reset, retry_after, 0, reserved, owed}
