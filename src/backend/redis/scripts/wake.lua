-- dlock wake-up: one entry in each waiter's mailbox. KEYS=B:w:<tok>, ... ARGV[1]=wake_ttl_ms
-- A mailbox someone broke only costs that waiter a heartbeat. Returns how many were woken.
local n = 0
for _, box in ipairs(KEYS) do
  if type(redis.pcall('LPUSH', box, '1')) == 'number' then
    redis.call('PEXPIRE', box, ARGV[1])
    n = n + 1
  end
end
return n
