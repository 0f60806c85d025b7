-- dlock status (read-only). KEYS[1]=B:fence KEYS[2]=B:holders KEYS[3]=B:qdl
-- KEYS[4]=B:h: (no token: never exists; declared so that a Cluster never runs this mid-migration)
-- Returns {1, last_fence|nil, live_waiters, {{owner, pttl, fence, meta, since_ms}, ...}}
--         {-2, key, what}: KEY holds data dlock did not write
-- Strings (fence, meta) are returned as stored: the client decides what to make of them.
local B = string.sub(KEYS[1], 1, -7)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bad(key, want)
  local k = redis.call('TYPE', key)['ok']
  if k ~= 'none' and k ~= want then return {-2, key, 'a ' .. k .. ', not a ' .. want} end
end
local b = bad(KEYS[1], 'string') or bad(KEYS[2], 'set') or bad(KEYS[3], 'zset')
if b then return b end
local holders = {}
for _, h in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local k = B .. ':h:' .. h
  b = bad(k, 'hash')
  if b then return b end
  local p = redis.call('PTTL', k)
  if p ~= -2 then
    local v = redis.call('HMGET', k, 'fence', 'meta', 'since')
    table.insert(holders, {h, p, v[1], v[2], v[3]})
  end
end
return {1, redis.call('GET', KEYS[1]), redis.call('ZCOUNT', KEYS[3], now, '+inf'), holders}
