-- dlock status (read-only). KEYS[1]=B:fence KEYS[2]=B:holders KEYS[3]=B:qdl
-- Returns {last_fence|nil, live_waiters, {{owner, pttl, fence, meta, since_ms}, ...}}
local B = string.sub(KEYS[1], 1, -7)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = {}
for _, h in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local k = B .. ':h:' .. h
  local p = redis.call('PTTL', k)
  if p ~= -2 then
    local v = redis.call('HMGET', k, 'fence', 'meta', 'since')
    table.insert(holders, {h, p, v[1], v[2], v[3]})
  end
end
return {redis.call('GET', KEYS[1]), redis.call('ZCOUNT', KEYS[3], now, '+inf'), holders}
