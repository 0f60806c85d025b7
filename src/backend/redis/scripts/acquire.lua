-- dlock acquire / re-check / heartbeat.  One call = one attempt.
-- KEYS[1]=B:fence KEYS[2]=B:owners KEYS[3]=B:hold KEYS[4]=B:queue KEYS[5]=B:qdl KEYS[6]=B:w:<tok>
-- ARGV[1]=tok ARGV[2]=limit ARGV[3]=ttl_ms ARGV[4]=waiter_lease_ms ARGV[5]=meta_json
-- ARGV[6]=mode ('try' = never enqueue, 'wait' = enqueue/heartbeat) ARGV[7]=ticket (0 = none yet)
-- Every key it touches is one of KEYS (Redis Cluster requires it); a holder is a member of
-- B:owners (score: its lease deadline, server ms) and fields '<tok>:<what>' of B:hold. A token
-- that starts with 's:' asks to hold shared (modes.lua): it is granted beside other shared
-- holders, unless an exclusive waiter is ahead of it in line.
-- Returns {-1, their_limit}                    a holder uses another --limit
--         {1, 'fence', ttl_ms, next}           granted (or already ours: idempotent retry);
--                                              every grant, shared or not, takes a new fence;
--                                              the fence is a decimal string, exact to 2^63-1;
--                                              next: the waiter now first in line ('' none),
--                                              whom my release will most likely wake
--         {0, hint_ms, ahead, ticket, holders, {tok, ...}}
--                                              not granted (hint -1 = none); ahead = waiters
--                                              in line before me (all of them in 'try' mode);
--                                              the waiters the caller must wake (B:w:<tok>)
--         {-2, key, what}                      KEY holds data dlock did not write
--         {-3, key}                            the fencing counter KEY is at 2^63-1
local tok, limit, ttl, wttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function int(x) return string.format('%.0f', x) end   -- never let Redis format a Lua number
local function keep(key, ms)            -- make KEY live at least MS (a decimal string) more milliseconds
  if redis.call('PTTL', key) < tonumber(ms) then redis.call('PEXPIRE', key, ms) end
end
local function kind(key) return redis.call('TYPE', key)['ok'] end
local function drop(h)                  -- forget holder H (its lease ran out)
  redis.call('ZREM', KEYS[2], h)
  redis.call('HDEL', KEYS[3], h .. ':fence', h .. ':meta', h .. ':since', h .. ':ttl', h .. ':limit')
end

-- 0. every key must hold what dlock keeps there (or nothing)
for _, e in ipairs({{KEYS[1], 'string'}, {KEYS[2], 'zset'}, {KEYS[3], 'hash'}, {KEYS[4], 'zset'},
                    {KEYS[5], 'zset'}, {KEYS[6], 'list'}}) do
  local k = kind(e[1])
  if k ~= 'none' and k ~= e[2] then return {-2, e[1], 'a ' .. k .. ', not a ' .. e[2]} end
end

-- The fencing counter: one more than the last token (INCR: exact up to 2^63-1, an error rather
-- than a wrap past it), and never behind the server's clock in microseconds. A crash can set the
-- counter back (AOF everysec, snapshots) or lose it (no persistence); the clock has moved past
-- every token handed out before, so tokens still grow. The counter never passes through a Lua
-- number (a double, exact only to 2^53): it is compared and returned as a decimal string.
local function next_fence()
  local r = redis.pcall('INCR', KEYS[1])
  if type(r) == 'table' and r['err'] then
    if string.find(r['err'], 'overflow', 1, true) then return nil, {-3, KEYS[1]} end
    if string.find(r['err'], 'not an integer', 1, true) then
      local v = redis.call('GET', KEYS[1]) or ''
      return nil, {-2, KEYS[1], '"' .. string.sub(v, 1, 40) .. '", not a whole number'}
    end
    return nil, redis.error_reply(r['err'])                    -- READONLY, OOM, …: as they are
  end
  local seq = redis.call('GET', KEYS[1])                      -- canonical: INCR wrote it
  local floor = t[1] .. string.format('%06d', tonumber(t[2])) -- TIME in µs, exact
  -- seq < floor for decimal integers (floor is positive, both without leading zeros)
  if string.sub(seq, 1, 1) == '-' or #seq < #floor or (#seq == #floor and seq < floor) then
    redis.call('SET', KEYS[1], floor)
    seq = floor
  end
  return seq
end

-- 1. a retry after a lost reply finds its own hold
local mine = tonumber(redis.call('ZSCORE', KEYS[2], tok))
if mine and mine >= now then
  local f = redis.call('HGET', KEYS[3], tok .. ':fence')
  if f then return {1, f, mine - now} end
end

-- 2. live holders: forget those whose lease ran out (a deadline in the past)
for _, h in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)) do drop(h) end
local live, excl, soonest = 0, 0, -1
for i, h in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local l = tonumber(redis.call('HGET', KEYS[3], h .. ':limit'))
  if l and l ~= limit then return {-1, l} end       -- holders disagree on --limit
  live = live + 1
  if not shared(h) then excl = excl + 1 end
  if i == 1 then soonest = tonumber(redis.call('ZSCORE', KEYS[2], h)) - now end
end

-- 3. purge waiters whose heartbeat deadline passed (killed, crashed), at most 100 per call,
-- and places in line at the head of the queue with no heartbeat at all (no dlock writes one
-- without the other: written by hand, or half of it lost): they would never lapse
local purged = 0
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[4], w); redis.call('ZREM', KEYS[5], w)
  purged = purged + 1
end
for _ = 1, 100 do
  local dropped = false
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, limit - 1)) do
    if w ~= tok and not redis.call('ZSCORE', KEYS[5], w) then
      redis.call('ZREM', KEYS[4], w); purged = purged + 1; dropped = true
    end
  end
  if not dropped then break end
end

-- 4. my place in line (newcomers line up behind everyone)
local rank = redis.call('ZRANK', KEYS[4], tok)
local queued = rank ~= false
if not queued then rank = redis.call('ZCARD', KEYS[4]) end

-- Whether nobody who must go first is ahead of me (then I watch the holders' expiry), and
-- whether I may hold now: an exclusive run when the live holders and the waiters ahead leave it
-- a place; a shared run when no exclusive run holds and none waits ahead of it (readers ahead
-- of it are admitted beside it; a reader behind a waiting writer waits for that writer).
local first, fits
if shared(tok) then
  first = not writer_ahead(KEYS[4], rank)
  fits = first and excl == 0
else
  first = rank < limit
  fits = live + rank < limit
end

if fits then
  local fence, err = next_fence()
  if not fence then return err end
  redis.call('HSET', KEYS[3], tok .. ':fence', fence, tok .. ':meta', ARGV[5],
             tok .. ':since', int(now), tok .. ':ttl', ARGV[3], tok .. ':limit', ARGV[2])
  redis.call('ZADD', KEYS[2], int(now + ttl), tok)
  keep(KEYS[2], ARGV[3]); keep(KEYS[3], ARGV[3])
  if queued then redis.call('ZREM', KEYS[4], tok); redis.call('ZREM', KEYS[5], tok) end
  redis.call('DEL', KEYS[6])
  return {1, fence, ttl, redis.call('ZRANGE', KEYS[4], 0, 0)[1] or ''}
end

-- a purge may have let waiters ahead of me move up: the caller wakes those that now fit
local wake = {}
if purged > 0 then
  for _, w in ipairs(fitting(KEYS[4], limit, live, excl)) do
    if w ~= tok then table.insert(wake, w) end
  end
end

if ARGV[6] ~= 'wait' then return {0, soonest, rank, 0, live, wake} end

-- The ticket orders the queue: later than every ticket in line and than the clock in µs
-- (exact as a sorted-set score until the year 2255). A purged live waiter keeps its old one.
local ticket = tonumber(ARGV[7])
if not queued then
  if ticket == 0 then
    ticket = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
    if last and tonumber(last) >= ticket then ticket = tonumber(last) + 1 end
  end
  redis.call('ZADD', KEYS[4], int(ticket), tok)
  rank = redis.call('ZRANK', KEYS[4], tok)
else
  ticket = tonumber(redis.call('ZSCORE', KEYS[4], tok))
end
-- the heartbeat: a waiter that stops calling drops out WAITER_LEASE after its last call
redis.call('ZADD', KEYS[5], int(now + wttl), tok)
keep(KEYS[4], ARGV[4]); keep(KEYS[5], ARGV[4])
local hint = -1
if first then hint = soonest end                     -- next in line: watch the holders' expiry
return {0, hint, rank, ticket, live, wake}
