-- dlock acquire / re-check / heartbeat.  One call = one attempt.
-- KEYS[1]=B:fence KEYS[2]=B:holders KEYS[3]=B:queue KEYS[4]=B:qdl KEYS[5]=B:h:<tok> KEYS[6]=B:w:<tok>
-- ARGV[1]=tok ARGV[2]=limit ARGV[3]=ttl_ms ARGV[4]=waiter_ttl_ms ARGV[5]=meta_json
-- ARGV[6]=mode ('try' = never enqueue, 'wait' = enqueue/heartbeat) ARGV[7]=ticket (0 = none yet)
-- Returns {-1, their_limit}                 a holder uses another --limit
--         {1, fence, ttl_ms}               granted (or already ours: idempotent retry)
--         {0, hint_ms, rank, ticket, holders} not granted (hint -1 = none)
local B = string.sub(KEYS[1], 1, -7)
local tok, limit, ttl, wttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function int(x) return string.format('%.0f', x) end   -- never let Redis format a Lua number
local function keep(key, ms)            -- make KEY live at least MS (a decimal string) more milliseconds
  if redis.call('PTTL', key) < tonumber(ms) then redis.call('PEXPIRE', key, ms) end
end
-- The fencing counter: one more than the last token, and never behind the server's clock in
-- microseconds. A crash can set the counter back (AOF everysec, snapshots) or lose it (no
-- persistence); the clock has moved past every token handed out before, so tokens still grow.
local function next_seq()
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local seq = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, now_us)
  redis.call('SET', KEYS[1], int(seq))
  return seq
end

-- 1. a retry after a lost reply finds its own hold
if redis.call('SISMEMBER', KEYS[2], tok) == 1 then
  local f = redis.call('HGET', KEYS[5], 'fence')
  if f then return {1, tonumber(f), redis.call('PTTL', KEYS[5])} end
end

-- 2. live holders: drop index entries whose entry expired or was deleted
local live, soonest = 0, -1
for _, h in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local k = B .. ':h:' .. h
  local p = redis.call('PTTL', k)
  if p == -2 then redis.call('SREM', KEYS[2], h)
  else
    local l = tonumber(redis.call('HGET', k, 'limit'))
    if l and l ~= limit then return {-1, l} end       -- holders disagree on --limit
    live = live + 1
    if p >= 0 and (soonest < 0 or p < soonest) then soonest = p end
  end
end

-- 3. purge waiters whose heartbeat deadline passed (crashed), at most 100 per call
local purged = 0
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[3], w); redis.call('ZREM', KEYS[4], w); redis.call('DEL', B .. ':w:' .. w)
  purged = purged + 1
end

-- 4. my place in line (newcomers line up behind everyone)
local rank = redis.call('ZRANK', KEYS[3], tok)
local queued = rank ~= false
if not queued then rank = redis.call('ZCARD', KEYS[3]) end

if live + rank < limit then
  local fence = next_seq()
  redis.call('HSET', KEYS[5], 'fence', int(fence), 'meta', ARGV[5], 'since', int(now), 'ttl', ARGV[3], 'limit', ARGV[2])
  redis.call('PEXPIRE', KEYS[5], ARGV[3])
  redis.call('SADD', KEYS[2], tok)
  keep(KEYS[2], ARGV[3])
  if queued then redis.call('ZREM', KEYS[3], tok); redis.call('ZREM', KEYS[4], tok) end
  redis.call('DEL', KEYS[6])
  return {1, fence, ttl}
end

-- a purge may have let waiters ahead of me move up: wake those that now fit
if purged > 0 then
  for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, limit - live - 1)) do
    if w ~= tok then
      redis.call('LPUSH', B .. ':w:' .. w, '1'); redis.call('PEXPIRE', B .. ':w:' .. w, ARGV[4])
    end
  end
end

if ARGV[6] ~= 'wait' then return {0, soonest, -1, 0, live} end

local ticket = tonumber(ARGV[7])
if not queued then
  if ticket == 0 then ticket = next_seq() end        -- first arrival: take a ticket
  redis.call('ZADD', KEYS[3], int(ticket), tok)           -- (a purged live waiter keeps its old ticket)
  rank = redis.call('ZRANK', KEYS[3], tok)
else
  ticket = tonumber(redis.call('ZSCORE', KEYS[3], tok))
end
redis.call('ZADD', KEYS[4], int(now + wttl), tok)
keep(KEYS[3], ARGV[4]); keep(KEYS[4], ARGV[4])
local hint = -1
if rank < limit then hint = soonest end               -- next in line: watch the holders' expiry
return {0, hint, rank, ticket, live}
