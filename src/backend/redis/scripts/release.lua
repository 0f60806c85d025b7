-- dlock release / cancel ("leave"): remove my hold and/or my place in line, then say who now fits.
-- KEYS[1]=B:owners KEYS[2]=B:hold KEYS[3]=B:queue KEYS[4]=B:qdl KEYS[5]=B:w:<tok>
-- KEYS[6]=B:w:<next> (optional: the mailbox of the waiter that was next in line at my grant)
-- ARGV[1]=tok ARGV[2]=limit ARGV[3]='holder'|'waiter' (what the caller believes it is)
-- ARGV[4]=next (with KEYS[6]) ARGV[5]=wake_ttl_ms (with KEYS[6])
-- Returns {held, woken, {tok, ...}}: held=1 if my hold was still live (0 = it had expired or
--         been deleted); woken=1 with the tokens of the waiters my leaving admits, which the
--         caller wakes (B:w:<tok>: keys this script cannot declare, so it does not touch them);
--         woken=2 when one of them is ARGV[4]: its mailbox is KEYS[6], woken here already, and
--         the list holds the others (usually none: one release admits one exclusive waiter;
--         it admits the whole run of shared waiters at the head of the line at once)
--         {-2, key, what}: KEY holds data dlock did not write (my mailbox is gone all the same)
local tok, limit = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function drop(h)
  redis.call('ZREM', KEYS[1], h)
  redis.call('HDEL', KEYS[2], h .. ':fence', h .. ':meta', h .. ':since', h .. ':ttl', h .. ':limit')
end

redis.call('DEL', KEYS[5])
for _, e in ipairs({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], 'zset'}, {KEYS[4], 'zset'}}) do
  local k = redis.call('TYPE', e[1])['ok']
  if k ~= 'none' and k ~= e[2] then return {-2, e[1], 'a ' .. k .. ', not a ' .. e[2]} end
end
-- only entries named by MY token are removed: a newer holder has another token
local mine = tonumber(redis.call('ZSCORE', KEYS[1], tok))
local held = 0
if mine and mine >= now and redis.call('HEXISTS', KEYS[2], tok .. ':fence') == 1 then held = 1 end

-- The waiters that fitted before I left, counting my hold as live when the caller held it
-- (a release after an expiry nobody noticed still wakes the next): woken already, by the
-- leaving that let them in. Those that fit once I have left (and the dead are gone) and did
-- not fit before are the ones my leaving admits.
local live, excl = holders(KEYS[1], now)
if held == 0 and ARGV[3] == 'holder' then
  live = live + 1
  if not shared(tok) then excl = excl + 1 end
end
local before = {}
for _, w in ipairs(fitting(KEYS[3], limit, live, excl)) do before[w] = true end

drop(tok)
redis.call('ZREM', KEYS[3], tok); redis.call('ZREM', KEYS[4], tok)

for _, h in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)) do drop(h) end
live, excl = holders(KEYS[1], now)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[3], w); redis.call('ZREM', KEYS[4], w)
end
-- a place in line with no heartbeat at all (written by hand) would never lapse: drop it
if limit > live then
  for _ = 1, 100 do
    local dropped = false
    for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, limit - live - 1)) do
      if not redis.call('ZSCORE', KEYS[4], w) then redis.call('ZREM', KEYS[3], w); dropped = true end
    end
    if not dropped then break end
  end
end

-- wake exactly the waiters my leaving lets in; the one that was next at my grant (the common
-- case) right here, through its mailbox KEYS[6]
local wake, woke_next = {}, false
for _, w in ipairs(fitting(KEYS[3], limit, live, excl)) do
  if not before[w] then
    if KEYS[6] and w == ARGV[4] and type(redis.pcall('LPUSH', KEYS[6], '1')) == 'number' then
      redis.call('PEXPIRE', KEYS[6], ARGV[5])
      woke_next = true
    else
      table.insert(wake, w)
    end
  end
end
if woke_next then return {held, 2, wake} end
if #wake > 0 then return {held, 1, wake} end
return {held, 0}
