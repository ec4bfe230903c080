-- The UTC calendar's windows, shared by the scripts that count fixed
-- windows (fixed_window.lua, release.lua and the primary's transfer of a
-- fixed window): concatenated in front of each at build time
-- (src/store/redis), so the calendar's arithmetic exists once in Lua, as
-- src/quota/calendar.rs is its one copy in Rust.
--
-- turns_of(from, to, p, cal): how many windows turned from the one that
-- starts at `from` to the one that starts at `to` (calendar months by the
-- calendar, whatever their lengths).
--
-- window_of(now, p, cal): the window `now` falls in, {start, end}:
-- multiples of `p` since the epoch, or with `cal` = 1 the week from Monday
-- 00:00 UTC, with `cal` = 2 the month from the 1st 00:00 UTC (Howard
-- Hinnant's civil-date arithmetic). Times in ms; all of them whole.
local DAY = 86400000
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
-- The civil year and month of the day `t` (ms) falls on.
local function year_month(t)
  local z = idiv(t, DAY) + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local m = mp - 9
  if mp < 10 then m = mp + 3 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function window_of(now, p, cal)
  if cal == 1 then
    local day = idiv(now, DAY)
    local monday = day - (day + 3) % 7
    return monday * DAY, (monday + 7) * DAY
  elseif cal == 2 then
    local function days_from_civil(y, m, d)
      if m <= 2 then y = y - 1 end
      local era = idiv(y, 400)
      local yoe = y - era * 400
      local mp = m + 9
      if m > 2 then mp = m - 3 end
      local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + idiv(153 * mp + 2, 5) + d - 1
      return era * 146097 + doe - 719468
    end
    local y, m = year_month(now)
    local ny, nm = y, m + 1
    if nm > 12 then ny, nm = y + 1, 1 end
    return days_from_civil(y, m, 1) * DAY, days_from_civil(ny, nm, 1) * DAY
  end
  local start = now - now % p
  return start, start + p
end
local function turns_of(from, to, p, cal)
  if cal == 1 then return idiv(to - from, 7 * DAY) end
  if cal == 2 then
    local y1, m1 = year_month(from)
    local y2, m2 = year_month(to)
    return (y2 * 12 + m2) - (y1 * 12 + m1)
  end
  return idiv(to - from, p)
end
-- The longest window: how long a count carried over a window lives.
local function longest(p, cal)
  if cal == 1 then return 7 * DAY end
  if cal == 2 then return 31 * DAY end
  return p
end
