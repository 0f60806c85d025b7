-- dlock --min-hold: the command has ended; record it in my holder metadata while the hold is
-- still mine.  KEYS[1]=B:owners KEYS[2]=B:hold  ARGV[1]=tok ARGV[2]=meta_json
-- Returns 1 when recorded, 0 when the hold is no longer mine (expired, deleted, taken over).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' or redis.call('TYPE', KEYS[2])['ok'] ~= 'hash' then
  return 0
end
local mine = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not mine or mine < now or redis.call('HEXISTS', KEYS[2], ARGV[1] .. ':fence') == 0 then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1] .. ':meta', ARGV[2])
return 1
