-- dlock: locks live on a master. On a replica (read-only or not: a writable one would keep a
-- lock its master never sees) answer DLOCKREPLICA <master host> <master port> and do nothing.
-- Put before the scripts that take, show or force a lock; a block of its own, so that the
-- script that follows keeps its own names.
do
  local info = redis.call('INFO', 'replication')
  if string.find(info, 'role:slave', 1, true) then
    return redis.error_reply('DLOCKREPLICA ' .. (string.match(info, 'master_host:([^\r\n]*)') or '?')
      .. ' ' .. (string.match(info, 'master_port:(%d+)') or '?'))
  end
end
