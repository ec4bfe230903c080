-- In-flight slots of a concurrency limit, counted per instance: never a
-- bare counter, so an instance that dies takes its slots with it when its
-- lease of them expires.
--
-- KEYS[1]: a hash of member -> "slots:expires_ms" (expiry on Redis's clock).
-- ARGV: member, hold, want, max, ttl_ms.
--
-- `hold` is how many slots the member holds now by its own count: its
-- entry is set to that (not added to), so a call that timed out, whose
-- answer the member never saw, is corrected by the next one. Expired
-- members are dropped. Then up to `want` more are granted, as many as fit
-- under `max` beside every other member's. The entry lives ttl_ms; a
-- member renews it with want = 0, and leaves with hold = 0. The hash
-- lives as long as its longest entry.
-- Reply: {granted, slots held by all members after the call, 0, 0, 0, 0}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local hold = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local all = redis.call('HGETALL', KEYS[1])
local others = 0
for i = 1, #all, 2 do
  local n, expires = string.match(all[i + 1], '^(%d+):(%d+)$')
  if n == nil or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= member then
    others = others + tonumber(n)
  end
end
local room = max - others - hold
if room < 0 then room = 0 end
local granted = want
if granted > room then granted = room end
local held = hold + granted
if held > 0 then
  redis.call('HSET', KEYS[1], member, held .. ':' .. (now + ttl))
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
else
  redis.call('HDEL', KEYS[1], member)
end
return {granted, others + held, 0, 0, 0, 0}
