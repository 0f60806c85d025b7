-- dlock renew: compare-and-renew.  KEYS[1]=B:owners KEYS[2]=B:hold  ARGV[1]=tok ARGV[2]=ttl_ms
-- Returns the granted TTL in ms, or -2 when the hold is gone (expired, deleted, released by force,
-- data lost), or -3 when a key of the lock was overwritten with something dlock did not write.
local tok, ttl = ARGV[1], tonumber(ARGV[2])
for _, e in ipairs({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}}) do
  local k = redis.call('TYPE', e[1])['ok']
  if k ~= 'none' and k ~= e[2] then return -3 end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mine = tonumber(redis.call('ZSCORE', KEYS[1], tok))
if not mine or mine < now or redis.call('HEXISTS', KEYS[2], tok .. ':fence') == 0 then
  redis.call('ZREM', KEYS[1], tok)
  redis.call('HDEL', KEYS[2], tok .. ':fence', tok .. ':meta', tok .. ':since', tok .. ':ttl',
             tok .. ':limit')
  return -2
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), tok)
for _, k in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ARGV[2]) end
end
return ttl
