-- dlock release --force. KEYS[1]=B:owners KEYS[2]=B:hold KEYS[3]=B:queue KEYS[4]=B:qdl
-- ARGV[1]=stale_ms
-- Deletes every holder entry and every waiter entry no live dlock keeps: a heartbeat deadline
-- that passed (a killed process), none at all, or one further ahead than STALE_MS (no live
-- dlock writes one). The live ones among those are woken by the caller,
-- so they rejoin at once, in their old place (they keep their tickets); so are the waiters
-- that fit now (the head of the line, or the run of shared waiters there), so that they
-- re-check at once. Every holder goes, shared ones too: each notices at its next renewal.
-- Returns {1, {{owner, fence, meta}, ...} of the holders removed, waiter entries removed,
--          {tok, ...} the waiters to wake (B:w:<tok>)}
--         {-2, key, what}: KEY holds data dlock did not write (nothing was changed)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bad(key, want)
  local k = redis.call('TYPE', key)['ok']
  if k ~= 'none' and k ~= want then return {-2, key, 'a ' .. k .. ', not a ' .. want} end
end
local b = bad(KEYS[1], 'zset') or bad(KEYS[2], 'hash') or bad(KEYS[3], 'zset')
  or bad(KEYS[4], 'zset')
if b then return b end
local removed, limit = {}, 1
for _, h in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')) do
  local v = redis.call('HMGET', KEYS[2], h .. ':fence', h .. ':meta', h .. ':limit')
  if v[1] then
    table.insert(removed, {h, v[1], v[2]})
    limit = math.max(limit, tonumber(v[3]) or 1)
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
local stale, wake = 0, {}
for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, 9999)) do
  local deadline = tonumber(redis.call('ZSCORE', KEYS[4], w))
  if not deadline or deadline < now or deadline > now + tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[3], w); redis.call('ZREM', KEYS[4], w)
    if not (deadline and deadline < now) then table.insert(wake, w) end
    stale = stale + 1
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. now)
for _, w in ipairs(fitting(KEYS[3], limit, 0, 0)) do table.insert(wake, w) end
return {1, removed, stale, wake}
