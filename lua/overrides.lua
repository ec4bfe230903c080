-- Per-tenant overrides of limits, changed at run time through the admin
-- API and read by every instance of the fleet.
--
-- KEYS[1]: the version, a counter bumped by every change.
-- KEYS[2..]: one hash per limit, `who` ("tier:value") -> the override as
-- JSON ({"rate", "burst", "expires_ms"}).
-- ARGV[1]: "version" (reply {version}), "load" (reply {version, then for
-- each hash of KEYS[2..] its position, field and value}), "set" (ARGV[2]
-- the field, ARGV[3] the value, into KEYS[2]) or "del" (ARGV[2] the field,
-- from KEYS[2]); a change replies {version} after the bump.
-- Every key shares the `{overrides}` hash tag: one Cluster slot. A change
-- is announced on the channel `lg:{overrides}:changed` (the new version),
-- which wakes every instance's poll.

local op = ARGV[1]
if op == 'set' or op == 'del' then
  if op == 'set' then
    -- ARGV[4]: the most overrides one limit may hold; a new one past it
    -- is refused ({'full'}), changing nothing.
    if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 and redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then
      return {'full'}
    end
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  elseif redis.call('HDEL', KEYS[2], ARGV[2]) == 0 then
    -- Nothing to delete (another instance dropped it first): no change,
    -- no new version for the fleet to load.
    return {redis.call('GET', KEYS[1]) or '0'}
  end
  local version = redis.call('INCR', KEYS[1])
  redis.call('PUBLISH', 'lg:{overrides}:changed', version)
  return {tostring(version)}
end
local version = redis.call('GET', KEYS[1]) or '0'
if op == 'version' then
  return {version}
end
local out = {version}
for i = 2, #KEYS do
  local all = redis.call('HGETALL', KEYS[i])
  for j = 1, #all, 2 do
    out[#out + 1] = tostring(i - 1)
    out[#out + 1] = all[j]
    out[#out + 1] = all[j + 1]
  end
end
return out
