-- dlock release --force. KEYS[1]=B:holders KEYS[2]=B:queue KEYS[3]=B:qdl
-- KEYS[4]=B:h: (no token: never exists; declared so that a Cluster never runs this mid-migration)
-- ARGV[1]=wake_ttl_ms ARGV[2]=stale_ms
-- Deletes every holder entry and every waiter entry no live dlock keeps: a heartbeat deadline
-- that passed (a killed process), none at all, or one further ahead than STALE_MS (left by an
-- older dlock that heartbeat once per TTL). Those are woken on the way out, so a live one
-- rejoins at once, in its old place (it keeps its ticket). Then wakes the first waiters so
-- they re-check at once.
-- Returns {1, {{owner, fence, meta}, ...} of the holders removed, waiter entries removed}
--         {-2, key, what}: KEY holds data dlock did not write (nothing was changed)
local B = string.sub(KEYS[1], 1, -9)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function bad(key, want)
  local k = redis.call('TYPE', key)['ok']
  if k ~= 'none' and k ~= want then return {-2, key, 'a ' .. k .. ', not a ' .. want} end
end
local function wake(w)
  local box = B .. ':w:' .. w
  if type(redis.pcall('LPUSH', box, '1')) == 'number' then redis.call('PEXPIRE', box, ARGV[1]) end
end
local b = bad(KEYS[1], 'set') or bad(KEYS[2], 'zset') or bad(KEYS[3], 'zset')
if b then return b end
local members = redis.call('SMEMBERS', KEYS[1])
for _, h in ipairs(members) do
  b = bad(B .. ':h:' .. h, 'hash')
  if b then return b end
end
local removed, limit = {}, 1
for _, h in ipairs(members) do
  local k = B .. ':h:' .. h
  local v = redis.call('HMGET', k, 'fence', 'meta', 'limit')
  if v[1] then
    table.insert(removed, {h, v[1], v[2]})
    limit = math.max(limit, tonumber(v[3]) or 1)
  end
  redis.call('DEL', k)
end
redis.call('DEL', KEYS[1])
local stale = 0
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, 9999)) do
  local deadline = tonumber(redis.call('ZSCORE', KEYS[3], w))
  if not deadline or deadline < now or deadline > now + tonumber(ARGV[2]) then
    redis.call('ZREM', KEYS[2], w); redis.call('ZREM', KEYS[3], w)
    if deadline and deadline < now then redis.call('DEL', B .. ':w:' .. w) else wake(w) end
    stale = stale + 1
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. now)
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, limit - 1)) do wake(w) end
return {1, removed, stale}
