
end

local reply = take()
redis.call('SET', KEYS[2], reply[1], 'PX', remember)
return {reply[1], reply[2], 0, 0, 0}
