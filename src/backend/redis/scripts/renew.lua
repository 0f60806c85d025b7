-- dlock renew: compare-and-renew.  KEYS[1]=B:holders KEYS[2]=B:h:<tok>  ARGV[1]=tok ARGV[2]=ttl_ms
-- Returns the granted TTL in ms, or -2 when the hold is gone (expired, deleted, released by force,
-- data lost), or -3 when a key of the lock was overwritten with something dlock did not write.
for _, e in ipairs({{KEYS[1], 'set'}, {KEYS[2], 'hash'}}) do
  local k = redis.call('TYPE', e[1])['ok']
  if k ~= 'none' and k ~= e[2] then return -3 end
end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  redis.call('DEL', KEYS[2])
  return -2
end
if redis.call('PEXPIRE', KEYS[2], ARGV[2]) == 0 then
  redis.call('SREM', KEYS[1], ARGV[1])
  return -2
end
local p = redis.call('PTTL', KEYS[1])
if p < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('PTTL', KEYS[2])
