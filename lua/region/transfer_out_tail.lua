
end

-- What the bucket can spare: all it holds above `keep`, asked for by a
-- first pass that takes nothing.
if keep > 0 then
  ARGV[at] = '0'
  local now = take()
  ARGV[at] = tostring(math.min(want, math.max(now[2] - keep, 0)))
end
local reply = take()
redis.call('SET', KEYS[2], reply[1], 'PX', remember)
return {reply[1], reply[2], 0, 0, 0}
