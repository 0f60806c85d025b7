-- dlock modes: a holder or a waiter holds or waits shared (--shared) when its token starts with
-- 's:' (dlock gives such tokens to shared runs only), exclusively otherwise; the mode travels
-- with the token into every queue and holder entry, so no script needs another key for it.
-- Shared runs always have --limit 1. Put before the scripts that grant, admit or wake.
local RUN_MAX = 500        -- readers looked at in the run at the head of the line (the rest re-check)
local CHUNK = 32           -- queue entries read per ZRANGE while looking for a writer

local function shared(h) return string.sub(h, 1, 2) == 's:' end

-- The live holders of OWNERS at NOW (server ms): how many, and how many of them exclusive.
local function holders(owners, now)
  local live, excl = 0, 0
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', owners, now, '+inf')) do
    live = live + 1
    if not shared(h) then excl = excl + 1 end
  end
  return live, excl
end

-- Whether an exclusive waiter is among the first N places of QUEUE (past RUN_MAX places: taken
-- to be, so that a reader that far back waits until the line moves up).
local function writer_ahead(queue, n)
  local i = 0
  while i < n do
    if i >= RUN_MAX then return true end
    local last = math.min(n, i + CHUNK) - 1
    for _, w in ipairs(redis.call('ZRANGE', queue, i, last)) do
      if not shared(w) then return true end
    end
    i = last + 1
  end
  return false
end

-- The waiters of QUEUE that would be granted now, in line order, beside LIVE holders (EXCL of
-- them exclusive): with --limit N > 1, the first N - LIVE; with --limit 1, the head of the line
-- when it is exclusive and nobody holds, or the run of shared waiters at the head (up to
-- RUN_MAX) when no exclusive holder holds.
local function fitting(queue, limit, live, excl)
  if limit > 1 then
    if live >= limit then return {} end
    return redis.call('ZRANGE', queue, 0, limit - live - 1)
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head or excl > 0 then return {} end
  if not shared(head) then
    if live == 0 then return {head} end
    return {}
  end
  local run = {}
  while #run < RUN_MAX do
    local chunk = redis.call('ZRANGE', queue, #run, #run + CHUNK - 1)
    for _, w in ipairs(chunk) do
      if not shared(w) or #run >= RUN_MAX then return run end
      table.insert(run, w)
    end
    if #chunk < CHUNK then break end
  end
  return run
end
