-- dlock status (read-only). KEYS[1]=B:fence KEYS[2]=B:owners KEYS[3]=B:hold KEYS[4]=B:qdl
-- Returns {1, last_fence|nil, live_waiters, {{owner, pttl, fence, meta, held_ms|nil}, ...}}
--         held_ms: how long ago the holder was granted, by the server's clock
--         {-2, key, what}: KEY holds data dlock did not write
-- Strings (fence, meta) are returned as stored: the client decides what to make of them.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bad(key, want)
  local k = redis.call('TYPE', key)['ok']
  if k ~= 'none' and k ~= want then return {-2, key, 'a ' .. k .. ', not a ' .. want} end
end
local b = bad(KEYS[1], 'string') or bad(KEYS[2], 'zset') or bad(KEYS[3], 'hash')
  or bad(KEYS[4], 'zset')
if b then return b end
local holders = {}
local owners = redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf', 'WITHSCORES')
for i = 1, #owners, 2 do
  local h = owners[i]
  local v = redis.call('HMGET', KEYS[3], h .. ':fence', h .. ':meta', h .. ':since')
  local held = v[3] and tonumber(v[3]) and math.max(0, now - tonumber(v[3])) or false
  table.insert(holders, {h, tonumber(owners[i + 1]) - now, v[1], v[2], held})
end
return {1, redis.call('GET', KEYS[1]), redis.call('ZCOUNT', KEYS[4], now, '+inf'), holders}
