"""The Lua scripts of the Redis job store (runtime/cluster/job_store.py): each touches the keys of
one job only (its hash tag, so one Redis Cluster slot), atomically. A job's owner key is the fence:
only the node it names writes the job's state and output."""
from __future__ import annotations

__all__ = ("ADD", "ADVANCE", "CREATE", "DELETE", "RETRY", "SAVE", "TAKE", "TAKEN", "VOID")

TAKEN = "taken:"  # on the cancel channel: `taken:{node}:{job id}`, another node took that node's job (a retry)

# RunPod's /stream cursor, advanced atomically: the items past it, and the cursor moved past them.
ADVANCE = """
local n = redis.call('LLEN', KEYS[1])
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > c then
  redis.call('SET', KEYS[2], n, 'EX', ARGV[1])
  return redis.call('LRANGE', KEYS[1], c, n - 1)
end
return {}
"""

# A job's state, written by its owner only. KEYS: state, owner, out; ARGV: node, data, ttl (0 while
# unfinished). 0 when another node owns the job now.
SAVE = """
local owner = redis.call('GET', KEYS[2])
if owner and owner ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
  redis.call('EXPIRE', KEYS[3], ttl)
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], ARGV[1])
end
return 1
"""

# Output items, appended by the job's owner only. KEYS: owner, out; ARGV: node, the 1-based index
# of the first item, items... Those already in the list (a write sent again after a lost reply)
# are not appended twice.
ADD = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
local there = redis.call('LLEN', KEYS[2]) - (tonumber(ARGV[2]) - 1)
for i = 3 + math.max(0, there), #ARGV, 1000 do  -- in chunks: Lua's stack takes a few thousand values
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return 1
"""

# Take one job of a dead node. KEYS: owner, state; ARGV: dead node, this node. The job's state when
# it was still the dead node's (now this node's), else nil: another node took it, or it is gone.
TAKE = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return false end
local state = redis.call('GET', KEYS[2])
if not state then return false end
redis.call('SET', KEYS[1], ARGV[2])
return state
"""

# Retry a FAILED or TIMED_OUT job, through any node: it becomes this node's. KEYS: state, owner,
# out, cursor; ARGV: this node, the `retried` count the retry was asked on, the new state (IN_QUEUE,
# retried + 1), its invocation id, the cancel channel, the job id. 1 when taken (the output and the
# /stream cursor cleared, the keys kept until it ends again, and the node that owned it told on
# the channel, so it forgets its copy); else 2 when another node owns it now (it retried it), 0 when
# not (the job is gone, or this node's and not FAILED/TIMED_OUT in the store: an end not stored yet).
# Sent again after a lost reply it answers 1 (the state is ours).
RETRY = """
local data = redis.call('GET', KEYS[1])
if not data then return 0 end
local row = cjson.decode(data)
local owner = redis.call('GET', KEYS[2])
if owner == ARGV[1] and row.invocation_id == ARGV[4] and row.status == 'IN_QUEUE' then return 1 end
if (row.status ~= 'FAILED' and row.status ~= 'TIMED_OUT') or tonumber(row.retried or 0) ~= tonumber(ARGV[2]) then
  if owner and owner ~= ARGV[1] then return 2 end
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
if owner and owner ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[5], 'taken:' .. owner .. ':' .. ARGV[6])
end
return 1
"""

# Forget an expired job, unless another node owns it now (it took the job by a retry). KEYS: state,
# out, cursor, owner; ARGV: this node. 0 when it is another node's.
DELETE = """
local owner = redis.call('GET', KEYS[4])
if owner and owner ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
"""

# A job's first save when an Idempotency-Key names it (runtime/cluster/idempotency_keys.py): SAVE,
# unless the id was fenced (its key's claim was released or taken over): then -1 and nothing is
# stored. KEYS: state, owner, out, fence; ARGV: as SAVE.
CREATE = "if redis.call('EXISTS', KEYS[4]) == 1 then return -1 end\n" + SAVE

# Fence a job id that a key's claim named but whose job is not stored: its save is refused from
# now on (CREATE). KEYS: state, fence; ARGV: seconds. 0 when the job is stored (nothing fenced).
VOID = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
return 1
"""
