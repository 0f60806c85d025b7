-- dlock release --force. KEYS[1]=B:holders KEYS[2]=B:queue  ARGV[1]=wake_ttl_ms
-- Deletes every holder entry, wakes the first waiters so they re-check at once.
-- Returns {{owner, fence, meta}, ...} of the holders removed.
local B = string.sub(KEYS[1], 1, -9)
local removed, limit = {}, 1
for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local k = B .. ':h:' .. h
  local v = redis.call('HMGET', k, 'fence', 'meta', 'limit')
  if v[1] then
    table.insert(removed, {h, v[1], v[2]})
    limit = math.max(limit, tonumber(v[3]) or 1)
  end
  redis.call('DEL', k)
end
redis.call('DEL', KEYS[1])
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, limit - 1)) do
  redis.call('LPUSH', B .. ':w:' .. w, '1'); redis.call('PEXPIRE', B .. ':w:' .. w, ARGV[1])
end
return removed
