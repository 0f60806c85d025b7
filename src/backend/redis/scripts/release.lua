-- dlock release / cancel ("leave"): remove my hold and/or my place in line, then wake who now fits.
-- KEYS[1]=B:holders KEYS[2]=B:queue KEYS[3]=B:qdl KEYS[4]=B:h:<tok> KEYS[5]=B:w:<tok>
-- ARGV[1]=tok ARGV[2]=limit ARGV[3]=wake_ttl_ms ARGV[4]='holder'|'waiter' (what the caller believes it is)
-- Returns {held, woken}: held=1 if my entry still existed (0 = it had expired or been deleted)
--         {-2, key, what}: KEY holds data dlock did not write (my own entries are gone all the same)
local B = string.sub(KEYS[1], 1, -9)
local tok, limit = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- only keys named by MY token are touched: a newer holder has another token
local held = redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[5])
for _, e in ipairs({{KEYS[1], 'set'}, {KEYS[2], 'zset'}, {KEYS[3], 'zset'}}) do
  local k = redis.call('TYPE', e[1])['ok']
  if k ~= 'none' and k ~= e[2] then return {-2, e[1], 'a ' .. k .. ', not a ' .. e[2]} end
end
redis.call('SREM', KEYS[1], tok)
local rank = redis.call('ZRANK', KEYS[2], tok)
redis.call('ZREM', KEYS[2], tok); redis.call('ZREM', KEYS[3], tok)

local live = 0
for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', B .. ':h:' .. h) == 1 then live = live + 1 else redis.call('SREM', KEYS[1], h) end
end
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[2], w); redis.call('ZREM', KEYS[3], w); redis.call('DEL', B .. ':w:' .. w)
end

-- wake exactly the waiter that my leaving lets in: a freed slot admits rank free-1 (ranks below
-- were woken by earlier releases); an admitted waiter that cancels passes its wake-up on
local free = limit - live
local woken = 0
if free > 0 and (held == 1 or ARGV[4] == 'holder' or (rank and rank < free)) then
  local w = redis.call('ZRANGE', KEYS[2], free - 1, free - 1)[1]
  if w then
    local box = B .. ':w:' .. w
    if type(redis.pcall('LPUSH', box, '1')) == 'number' then redis.call('PEXPIRE', box, ARGV[3]) end
    woken = 1
  end
end
return {held, woken}
