"""The Redis store's server-side steps: one function library, loaded once per connection
pool with FUNCTION LOAD REPLACE, called with FCALL (pipelined, so no per-call round trip
and no SCRIPT EXISTS check).

Every function takes one key, the topic's prefix `gw:{topic}:`: every key it touches
starts with it, so they all hash to the topic's Cluster slot (the hash tag). The layout is
in docs/storage.md ("Redis"):

  m         hash  batch -> the messages of one publish: their shared fields (timestamp,
                  ttr, headers, ...) once, then every body (redis_codec.pack_batch).
                  A batch is named by its first id; its ids are consecutive
  x         zset  every score 0, member = "first:last:attempts:priority" of each batch,
                  so ZREVRANGEBYLEX finds the batch of an id in one step
  n         hash  batch -> entries (message x group) still holding it; the batch goes
                  with the last
  groups    hash  group -> paused (0/1)
  q:<g>     zset  ready since their publish: one member per publish, every score 0,
                  "priority(8 hex) first(16):last(16)", the range of its ids
  fresh     hash  group -> how many messages the ranges of q:<g> hold
  w         set   gateways whose last claim found too little: a publish of the topic
                  tells them on gw:notify (and empties the set), nobody else is told
  r:<g>     zset  ready, placed one by one (requeued, promoted, kicked, or a range taken
                  apart by a slow path): every score 0, member = 8 hex digits of
                  priority + 16 of id, so lexicographic order is (priority, id) in both
  d:<g>     zset  deferred: score = due (ms since the epoch), member = id
  c:<g>     zset  range claims: every score 0, member "first(16):last(16)", a run of ids
                  a claim took from the ranges of q:<g> (see "Range claims" below)
  e:<g>     zset  the same members, score = the claim's deadline (ms)
  k:<g>     hash  claim member -> the claiming gateway
  z:<g>:<first>  string  the claim's bitmap: 1 = no longer held by it
  held      hash  group -> messages its range claims hold
  f:<g>     zset  claimed one by one (in flight on some gateway): score = deadline (ms),
                  member = id
  o:<g>     hash  id -> the claiming gateway
  b:<g>     zset  buried: score = burial order, member = id
  s:<g>     hash  id -> "attempts:priority" (the per-group fields). A message ready since
                  its publish has none: its batch's attempts and priority hold, so a
                  publish writes three fields and one ready member per message, not more
The group "" is the topic's backlog (published before any group existed).

Ids are 16 lowercase hex digits everywhere (as NSQ shows them); an id's place in its
batch is computed with Lua numbers (doubles), exact below 2^53 (ids come from a counter
that grows by 65,536 per gateway start).
"""

from __future__ import annotations

from gateway.stores.redis_lua_claims import CLAIMS

LIBRARY_NAME = "gateway_v3"
# libraries an older gateway loaded: their functions have the same names, so they go first
OLD_LIBRARIES = ("gateway_v1", "gateway_v2")

LIBRARY = r"""#!lua name=gateway_v3

local function rkey(prio, id) return string.format('%08x', prio) .. id end
local function hex(n) return string.format('%016x', n) end

-- one command over many arguments, in slices that fit Lua's stack
local function bulk(cmd, key, items)
  local n = #items
  local i = 1
  while i <= n do
    local j = math.min(i + 3999, n)
    redis.call(cmd, key, unpack(items, i, j))
    i = j + 1
  end
end

-- HMGET of many fields, in slices that fit Lua's stack as well: a session's batch of FINs,
-- or the calls merged while Redis was away, may name tens of thousands
local function hmget(key, ids)
  local n = #ids
  if n <= 4000 then return redis.call('HMGET', key, unpack(ids)) end
  local out = {}
  local i = 1
  while i <= n do
    local j = math.min(i + 3999, n)
    local part = redis.call('HMGET', key, unpack(ids, i, j))
    for k = 1, j - i + 1 do out[i + k - 1] = part[k] end
    i = j + 1
  end
  return out
end

-- A publish's ready messages wait in q:<g> as ONE member, the range of its ids
-- "prio(8) first(16):last(16)": a publish costs a few commands whatever its size. Claims
-- take from the ranges and from r:<g> (every message placed one by one: requeued,
-- promoted, kicked) in (priority, id) order; `fresh` counts what the ranges hold. The
-- slow paths (a fresh message changed or deleted by id, paging, snapshots, drops) first
-- turn the ranges into members of r ("materialize"), and then see only r.
local function materialize(p, g)
  local q = p .. 'q:' .. g
  local ranges = redis.call('ZRANGE', q, 0, -1)
  if #ranges == 0 then return end
  local qs = {}
  for _, mem in ipairs(ranges) do
    local pre = string.sub(mem, 1, 8)
    for i = tonumber(string.sub(mem, 9, 24), 16), tonumber(string.sub(mem, 26, 41), 16) do
      qs[#qs + 1] = 0; qs[#qs + 1] = pre .. string.format('%016x', i)
    end
  end
  bulk('ZADD', p .. 'r:' .. g, qs)
  redis.call('DEL', q)
  redis.call('HDEL', p .. 'fresh', g)
end

local function ready_count(p, g)
  return redis.call('ZCARD', p .. 'r:' .. g) + (tonumber(redis.call('HGET', p .. 'fresh', g)) or 0)
end

-- the batch holding `id` (nil: none), from the index x
local function batch_of(p, id)
  local found = redis.call('ZREVRANGEBYLEX', p .. 'x', '(' .. id .. ';', '-', 'LIMIT', 0, 1)[1]
  if not found then return nil end
  local last = string.sub(found, 18, 33)
  if id > last then return nil end
  local c = string.find(found, ':', 35, true)
  return {first = string.sub(found, 1, 16), last = last, member = found,
          attempts = tonumber(string.sub(found, 35, c - 1)),
          prio = tonumber(string.sub(found, c + 1))}
end

-- `cur` when it holds `id`, else a look-up: over sorted ids, one look-up per batch
local function find(p, id, cur)
  if cur and id >= cur.first and id <= cur.last then return cur end
  return batch_of(p, id)
end

-- the packed message (shared fields, then its body) as redis_codec.unpack reads it; the
-- batch keeps its blob and offsets for the next message of the same call
local function packed(p, b, id)
  local blob = b.blob
  if not blob then
    blob = redis.call('HGET', p .. 'm', b.first)
    if not blob then return '' end
    local ml = struct.unpack('>I4', blob)
    b.blob, b.head, b.offs = blob, string.sub(blob, 1, 4 + ml), 9 + ml
    b.base = b.offs + 4 * (struct.unpack('<I4', blob, 5 + ml) + 1)
    b.f0 = tonumber(b.first, 16)
  end
  local o1, o2 = struct.unpack('<I4<I4', blob, b.offs + 4 * (tonumber(id, 16) - b.f0))
  return b.head .. string.sub(blob, b.base + o1, b.base + o2 - 1)
end

-- Range claims. The fresh messages a claim takes from the ranges of q:<g> are held as
-- ONE entry per run of consecutive ids, not as three writes per message (f, o, s):
--   c:<g>          zset   every score 0, member "first(16):last(16)": the run, so
--                         ZREVRANGEBYLEX finds the claim of an id (as x finds its batch)
--   e:<g>          zset   the same member, score = the claim's deadline (ms)
--   k:<g>          hash   member -> the claiming gateway
--   z:<g>:<first>  string bitmap over the run, bit i for id first + i: 1 once the claim
--                         no longer holds it (finished, or detached: moved to the
--                         per-message state f/o/s by a change that concerns it alone)
--   held           hash   group -> how many messages its range claims hold
-- A range-claimed message's attempts are its batch's + 1 (the claim counted them) and its
-- priority its batch's: nothing per message is written until it leaves the common path.
local function parse_claim(mem)
  local first = string.sub(mem, 1, 16)
  return {member = mem, first = first, last = string.sub(mem, 18, 33), f0 = tonumber(first, 16)}
end

-- the range claim of group g whose run holds `id` (nil: none), done or not
local function claim_of(p, g, id)
  local mem = redis.call('ZREVRANGEBYLEX', p .. 'c:' .. g, '(' .. id .. ';', '-', 'LIMIT', 0, 1)[1]
  if not mem or id > string.sub(mem, 18, 33) then return nil end
  return parse_claim(mem)
end

local function bits_key(p, g, c) return p .. 'z:' .. g .. ':' .. c.first end

-- a claim none of whose messages it still holds goes
local function claim_over(p, g, c)
  if redis.call('BITCOUNT', bits_key(p, g, c)) <= tonumber(c.last, 16) - c.f0 then return end
  redis.call('ZREM', p .. 'c:' .. g, c.member)
  redis.call('ZREM', p .. 'e:' .. g, c.member)
  redis.call('HDEL', p .. 'k:' .. g, c.member)
  redis.call('DEL', bits_key(p, g, c))
end

-- the ids claim c still holds, in order
local function unfinished(p, g, c)
  local bits = redis.call('GET', bits_key(p, g, c)) or ''
  local ids = {}
  for i = 0, tonumber(c.last, 16) - c.f0 do
    local byte = string.byte(bits, math.floor(i / 8) + 1) or 0
    if bit.band(byte, bit.rshift(128, i % 8)) == 0 then
      ids[#ids + 1] = string.format('%016x', c.f0 + i)
    end
  end
  return ids
end

-- End claim c: what it still holds becomes ready again (`ready`: its lease expired; the
-- attempt was counted by the claim) or claimed one message at a time, by the same
-- gateway until the same deadline (a slow path that must see every claimed message in
-- f/o/s). Returns how many messages it held.
local function dissolve(p, g, c, ready)
  local ids = unfinished(p, g, c)
  local deadline = redis.call('ZSCORE', p .. 'e:' .. g, c.member)
  local owner = redis.call('HGET', p .. 'k:' .. g, c.member)
  local ss, rs, fs, os = {}, {}, {}, {}
  local cur = nil
  for _, id in ipairs(ids) do
    cur = find(p, id, cur)
    if cur then
      ss[#ss + 1] = id; ss[#ss + 1] = (cur.attempts + 1) .. ':' .. cur.prio
      if ready then
        rs[#rs + 1] = 0; rs[#rs + 1] = rkey(cur.prio, id)
      else
        fs[#fs + 1] = deadline; fs[#fs + 1] = id
        os[#os + 1] = id; os[#os + 1] = owner
      end
    end
  end
  bulk('HSET', p .. 's:' .. g, ss)
  bulk('ZADD', p .. 'r:' .. g, rs)
  bulk('ZADD', p .. 'f:' .. g, fs)
  bulk('HSET', p .. 'o:' .. g, os)
  if #ids > 0 then redis.call('HINCRBY', p .. 'held', g, -#ids) end
  redis.call('ZREM', p .. 'c:' .. g, c.member)
  redis.call('ZREM', p .. 'e:' .. g, c.member)
  redis.call('HDEL', p .. 'k:' .. g, c.member)
  redis.call('DEL', bits_key(p, g, c))
  return #ids
end

-- every range claim of g becomes per-message claims (slow paths that list or drop)
local function dissolve_all(p, g)
  for _, mem in ipairs(redis.call('ZRANGE', p .. 'c:' .. g, 0, -1)) do
    dissolve(p, g, parse_claim(mem), false)
  end
end

-- One message of a range claim leaves it for the per-message state (claimed by the same
-- gateway until the same deadline), so a change of it alone (a requeue, a touch, a bury)
-- is the ordinary one. Returns its attempts, priority and batch; nil when no claim holds it.
local function detach(p, g, id, cur)
  local c = claim_of(p, g, id)
  if not c then return nil end
  if redis.call('SETBIT', bits_key(p, g, c), tonumber(id, 16) - c.f0, 1) == 1 then return nil end
  redis.call('HINCRBY', p .. 'held', g, -1)
  local b = find(p, id, cur)
  if b then
    redis.call('HSET', p .. 's:' .. g, id, (b.attempts + 1) .. ':' .. b.prio)
    redis.call('ZADD', p .. 'f:' .. g, redis.call('ZSCORE', p .. 'e:' .. g, c.member), id)
    redis.call('HSET', p .. 'o:' .. g, id, redis.call('HGET', p .. 'k:' .. g, c.member))
  end
  claim_over(p, g, c)
  if not b then return nil end
  return b.attempts + 1, b.prio, b
end

local function claimed_count(p, g)
  return redis.call('ZCARD', p .. 'f:' .. g) + (tonumber(redis.call('HGET', p .. 'held', g)) or 0)
end

-- attempts, priority of `id` in group g (nil: not there), and the batch looked up if any
local function fields(p, g, id, cur)
  local v = redis.call('HGET', p .. 's:' .. g, id)
  if v then
    local c = string.find(v, ':', 1, true)
    return tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1)), cur
  end
  local attempts, prio, held = detach(p, g, id, cur)
  if attempts then return attempts, prio, held end
  materialize(p, g)  -- a fresh one may still be in a range
  local b = find(p, id, cur)
  if b and redis.call('ZSCORE', p .. 'r:' .. g, rkey(b.prio, id)) then
    return b.attempts, b.prio, b
  end
  return nil, nil, b or cur
end

-- fn(batch, k) for each batch of `ids` (sorted here), k = how many of them it holds
local function each_batch(p, ids, fn)
  table.sort(ids)
  local cur, k = nil, 0
  for _, id in ipairs(ids) do
    local b = find(p, id, cur)
    if b ~= cur then
      if cur and k > 0 then fn(cur, k) end
      cur, k = b, 0
    end
    if b then k = k + 1 end
  end
  if cur and k > 0 then fn(cur, k) end
end

-- k entries of batch b are gone; the batch goes with its last
local function release(p, b, k)
  if redis.call('HINCRBY', p .. 'n', b.first, -k) <= 0 then
    redis.call('HDEL', p .. 'n', b.first)
    redis.call('HDEL', p .. 'm', b.first)
    redis.call('ZREM', p .. 'x', b.member)
  end
end

local function release_all(p, ids)
  each_batch(p, ids, function(b, k) release(p, b, k) end)
end

-- take a message out of whatever state it is in within one group (not its fields)
local function unplace(p, g, id, prio)
  redis.call('ZREM', p .. 'r:' .. g, rkey(prio, id))
  redis.call('ZREM', p .. 'd:' .. g, id)
  redis.call('ZREM', p .. 'b:' .. g, id)
  if redis.call('ZREM', p .. 'f:' .. g, id) == 1 then redis.call('HDEL', p .. 'o:' .. g, id) end
end

local function place(p, g, id, prio, state, score)
  if state == 'r' then
    redis.call('ZADD', p .. 'r:' .. g, 0, rkey(prio, id))
  elseif state == 'b' then
    redis.call('ZADD', p .. 'b:' .. g, redis.call('HINCRBY', p .. 'seq', 'b', 1), id)
  else
    redis.call('ZADD', p .. state .. ':' .. g, score, id)
  end
end

-- every id group g holds: those with fields, and those ready since their publish
local function all_ids(p, g)
  materialize(p, g)
  dissolve_all(p, g)
  local ids, seen = {}, {}
  for _, id in ipairs(redis.call('HKEYS', p .. 's:' .. g)) do
    seen[id] = true
    ids[#ids + 1] = id
  end
  for _, mem in ipairs(redis.call('ZRANGE', p .. 'r:' .. g, 0, -1)) do
    local id = string.sub(mem, 9)
    if not seen[id] then ids[#ids + 1] = id end
  end
  return ids
end

local function drop_all(p, g)
  release_all(p, all_ids(p, g))
  redis.call('DEL', p .. 's:' .. g, p .. 'r:' .. g, p .. 'd:' .. g, p .. 'b:' .. g,
             p .. 'f:' .. g, p .. 'o:' .. g, p .. 'q:' .. g)
  redis.call('HDEL', p .. 'fresh', g)
  redis.call('HDEL', p .. 'held', g)
end

-- the groups a publish goes to as Redis has them (shared): none while the topic is
-- paused or has no group, then the backlog '' keeps it
local function current_groups(p)
  if redis.call('HGET', p .. 'meta', 'paused') == '1' then return {} end
  return redis.call('HKEYS', p .. 'groups')
end

-- put: due_ms attempts prio ngroups g... first last blob told: one publish's messages (ids
-- first..last, consecutive) as one batch; ngroups -1: every group the topic has in Redis
-- now (several gateways publish; none has to know the others' groups). Per message only
-- nothing when ready (one range per group); delayed, its fields and due time.
redis.register_function('gw_put', function(keys, a)
  local p = keys[1]
  local due, attempts, prio, ng = tonumber(a[1]), a[2], tonumber(a[3]), tonumber(a[4])
  local groups = {}
  if ng < 0 then
    groups = current_groups(p)
    ng = 0
  else
    for i = 1, ng do groups[i] = a[4 + i] end
  end
  if #groups == 0 then groups[1] = '' end
  local first, last, blob, told, owner = a[5 + ng], a[6 + ng], a[7 + ng], a[8 + ng], a[9 + ng]
  -- A pipeline whose reply was lost is sent again, and Redis may have applied it: a put
  -- applied twice would make its messages claimable twice (part of the range may be
  -- claimed by then). A gateway's puts to a topic come in id order, so one mark per
  -- gateway tells: the first id of its last put applied (hex of equal width).
  if owner and owner ~= '' then
    local done = redis.call('HGET', p .. 'put', owner)
    if done and done >= first then return 0 end
    redis.call('HSET', p .. 'put', owner, first)
  end
  local f0 = tonumber(first, 16)
  local count = tonumber(last, 16) - f0 + 1
  -- the blob itself comes before this call, as a plain HSET of the same pipeline: passed
  -- through here it would be copied into Lua and collected again (most of a put's time)
  if blob ~= '' then redis.call('HSET', p .. 'm', first, blob) end
  redis.call('HSET', p .. 'n', first, count * #groups)
  redis.call('ZADD', p .. 'x', 0, first .. ':' .. last .. ':' .. attempts .. ':' .. prio)
  if due <= 0 then
    local range = string.format('%08x', prio) .. first .. ':' .. last
    for _, g in ipairs(groups) do
      -- counted once, should a retried pipeline put it again
      if redis.call('ZADD', p .. 'q:' .. g, 0, range) == 1 then
        redis.call('HINCRBY', p .. 'fresh', g, count)
      end
    end
    -- gateways whose last claim found the topic empty wait for this: tell them, once
    if told and told ~= '' and redis.call('DEL', p .. 'w') == 1 then
      redis.call('PUBLISH', 'gw:notify', told)
    end
    return #groups
  end
  local qs, ss = {}, {}
  local f = attempts .. ':' .. prio
  for i = 0, count - 1 do
    local id = string.format('%016x', f0 + i)
    qs[#qs + 1] = due; qs[#qs + 1] = id
    ss[#ss + 1] = id; ss[#ss + 1] = f
  end
  for _, g in ipairs(groups) do
    bulk('HSET', p .. 's:' .. g, ss)
    bulk('ZADD', p .. 'd:' .. g, qs)
  end
  return #groups
end)

-- update: group owner then (id attempts prio state score expect) x n
-- state r(eady) d(eferred, score = due) b(uried) f(claimed, score = deadline);
-- expect: where the message must be for the change to apply: f (in flight and claimed by
-- `owner`), b, d, r, or * (anywhere). A change that finds the message elsewhere (finished,
-- claimed or kicked by another gateway since) is skipped.
redis.register_function('gw_update', function(keys, a)
  local p, g, owner = keys[1], a[1], a[2]
  local applied, cur = 0, nil
  for i = 3, #a, 6 do
    local id, attempts, prio, state, score, expect =
      a[i], a[i + 1], tonumber(a[i + 2]), a[i + 3], tonumber(a[i + 4]), a[i + 5]
    local _, was, b = fields(p, g, id, cur)
    cur = b
    local ok = was ~= nil
    if ok and expect ~= '*' then
      if expect == 'f' then
        ok = redis.call('HGET', p .. 'o:' .. g, id) == owner
      elseif expect == 'r' then
        ok = redis.call('ZSCORE', p .. 'r:' .. g, rkey(was, id)) ~= false
      else
        ok = redis.call('ZSCORE', p .. expect .. ':' .. g, id) ~= false
      end
    end
    if ok then
      unplace(p, g, id, was)
      redis.call('HSET', p .. 's:' .. g, id, attempts .. ':' .. prio)
      place(p, g, id, prio, state, score)
      if state == 'f' then redis.call('HSET', p .. 'o:' .. g, id, owner) end
      applied = applied + 1
    end
  end
  return applied
end)

-- Set the bits of `runs` (sorted, disjoint {lo, hi} offsets) of bitmap `key` in one read
-- and one write; returns the offsets that were set already (finished before, or
-- detached), in order. Bit 0 is a byte's highest.
local function mark(key, runs)
  local masks = {}  -- byte -> the bits to set in it
  for _, r in ipairs(runs) do
    local lo, hi = r[1], r[2]
    local k0, k1 = math.floor(lo / 8), math.floor(hi / 8)
    for k = k0, k1 do
      local m = 255
      if k == k0 then m = bit.rshift(255, lo % 8) end
      if k == k1 then m = bit.band(m, 255 - bit.rshift(255, hi % 8 + 1)) end
      masks[k] = bit.bor(masks[k] or 0, m)
    end
  end
  local b0, b1 = math.floor(runs[1][1] / 8), math.floor(runs[#runs][2] / 8)
  local old = redis.call('GETRANGE', key, b0, b1)
  local bytes, was = {}, {}
  for k = b0, b1 do
    local o, m = string.byte(old, k - b0 + 1) or 0, masks[k] or 0
    if bit.band(o, m) ~= 0 then
      for x = 0, 7 do
        local one = bit.rshift(128, x)
        if bit.band(m, one) ~= 0 and bit.band(o, one) ~= 0 then was[#was + 1] = k * 8 + x end
      end
    end
    bytes[#bytes + 1] = string.char(bit.bor(o, m))
  end
  redis.call('SETRANGE', key, b0, table.concat(bytes))
  return was
end

-- remove: group owner item... (acknowledged or deleted); an item is an id or a run of
-- ids "first:last"; owner '' removes whoever holds them. The runs that fall in one range
-- claim cost one claim look-up, one read and one write of its bitmap and one count per
-- batch, however many there are (consumers sharing a gateway's claims finish every
-- other id, not runs); other messages are removed from wherever they are, field by
-- field, in bulk commands per call (a session's batch of FINs is one call).
redis.register_function('gw_remove', function(keys, a)
  local p, g, owner = keys[1], a[1], a[2]
  local items = {}
  for i = 3, #a do
    local v = a[i]
    local lo = tonumber(string.sub(v, 1, 16), 16)
    items[#items + 1] = {lo, #v > 16 and tonumber(string.sub(v, 18, 33), 16) or lo}
  end
  for i = 2, #items do  -- the gateway sends them in order: a sort only when they are not
    if items[i][1] < items[i - 1][1] then
      table.sort(items, function(x, y) return x[1] < y[1] end)
      break
    end
  end
  local runs = {}
  for _, item in ipairs(items) do  -- adjacent and overlapping ones joined
    local run = runs[#runs]
    if run and item[1] <= run[2] + 1 then
      if item[2] > run[2] then run[2] = item[2] end
    else
      runs[#runs + 1] = item
    end
  end
  items = runs
  local finished, rest, ranged, cur = 0, {}, {}, nil
  local ck = p .. 'c:' .. g
  -- the claim whose runs are being gathered (`mine`: this owner's to finish), and what
  -- each batch has lost so far, released once at the end
  local c, mine, parts, free_upto = nil, false, {}, -1
  local lost, order = {}, {}
  local function settle()  -- claim c's gathered runs: bits set, counted per batch
    if c and mine and #parts > 0 then
      local offs = {}
      for i, r in ipairs(parts) do offs[i] = {r[1] - c.f0, r[2] - c.f0} end
      local was = mark(bits_key(p, g, c), offs)
      local skip = {}
      for _, off in ipairs(was) do
        local x = hex(c.f0 + off)
        skip[c.f0 + off] = true
        rest[#rest + 1] = x  -- if detached, it is in f/o/s
        ranged[x] = true
      end
      for _, r in ipairs(parts) do
        local x = r[1]
        while x <= r[2] do  -- the count of each batch the run crosses
          cur = find(p, hex(x), cur)
          if not cur then break end
          local to = math.min(r[2], tonumber(cur.last, 16))
          local k = to - x + 1
          if #was > 0 then
            for off = x, to do if skip[off] then k = k - 1 end end
          end
          if k > 0 then
            local e = lost[cur.first]
            if not e then
              e = {cur, 0}
              lost[cur.first] = e
              order[#order + 1] = e
            end
            e[2] = e[2] + k
          end
          finished = finished + k
          x = to + 1
        end
      end
      claim_over(p, g, c)
    end
    c, parts = nil, {}
  end
  for _, item in ipairs(items) do
    local id, last = item[1], item[2]
    while id <= last do
      if not (c and id <= c.l0) and id > free_upto then
        settle()
        c = claim_of(p, g, hex(id))
        if c then
          c.l0 = tonumber(c.last, 16)
          mine = owner == '' or redis.call('HGET', p .. 'k:' .. g, c.member) == owner
        else  -- no claim holds the ids up to the next claim's first
          local nxt = redis.call('ZRANGEBYLEX', ck, '(' .. hex(id), '+', 'LIMIT', 0, 1)[1]
          free_upto = nxt and tonumber(string.sub(nxt, 1, 16), 16) - 1 or math.huge
        end
      end
      if c and id <= c.l0 then
        local upto = math.min(last, c.l0)
        if mine then parts[#parts + 1] = {id, upto} end  -- else another gateway's
        id = upto + 1
      else  -- one by one, up to the next claim
        local upto = math.min(last, free_upto)
        for x = id, upto do rest[#rest + 1] = hex(x) end
        id = upto + 1
      end
    end
  end
  settle()
  for _, e in ipairs(order) do release(p, e[1], e[2]) end
  if finished > 0 then redis.call('HINCRBY', p .. 'held', g, -finished) end
  local removed = finished
  if #rest > 0 then
    local r = p .. 'r:' .. g
    local svals = hmget(p .. 's:' .. g, rest)
    local holders = hmget(p .. 'o:' .. g, rest)
    local singles, members, seen = {}, {}, {}
    cur = nil
    for k, id in ipairs(rest) do
      if not seen[id] then
        seen[id] = true
        local v, holder, prio = svals[k], holders[k], nil
        if v then
          prio = tonumber(string.sub(v, string.find(v, ':', 1, true) + 1))
        elseif not ranged[id] then  -- ready since its publish, if anywhere
          materialize(p, g)
          cur = find(p, id, cur)
          if cur and redis.call('ZSCORE', r, rkey(cur.prio, id)) then prio = cur.prio end
        end
        if prio and (owner == '' or not holder or holder == owner) then
          singles[#singles + 1] = id
          members[#members + 1] = rkey(prio, id)
        end
      end
    end
    if #singles > 0 then
      bulk('ZREM', r, members)
      for _, k in ipairs({'d:', 'b:', 'f:'}) do bulk('ZREM', p .. k .. g, singles) end
      bulk('HDEL', p .. 'o:' .. g, singles)
      bulk('HDEL', p .. 's:' .. g, singles)
      removed = removed + #singles
      release_all(p, singles)
    end
  end
  return removed
end)

-- fan_out: group... (the backlog goes to every one of them)
local function fan_out(p, a)
  local ids = all_ids(p, '')
  table.sort(ids)
  local cur = nil
  for _, id in ipairs(ids) do
    local attempts, prio, b = fields(p, '', id, cur)
    cur = b
    if attempts then
      local due = redis.call('ZSCORE', p .. 'd:', id)
      for _, g in ipairs(a) do
        redis.call('HSET', p .. 's:' .. g, id, attempts .. ':' .. prio)
        if due then place(p, g, id, prio, 'd', due) else place(p, g, id, prio, 'r', 0) end
      end
    end
  end
  if #a == 0 then
    release_all(p, ids)
  elseif #a > 1 then
    each_batch(p, ids, function(b, k) redis.call('HINCRBY', p .. 'n', b.first, k * (#a - 1)) end)
  end
  redis.call('DEL', p .. 's:', p .. 'r:', p .. 'd:', p .. 'b:', p .. 'f:', p .. 'o:', p .. 'q:')
  redis.call('HDEL', p .. 'fresh', '')
  return #ids
end

redis.register_function('gw_fan_out', function(keys, a) return fan_out(keys[1], a) end)

-- add_group: group adopt; adopt '1' (shared): the first group takes the backlog
redis.register_function('gw_add_group', function(keys, a)
  local p = keys[1]
  local added = redis.call('HSETNX', p .. 'groups', a[1], 0)
  if added == 1 and a[2] == '1' and redis.call('HLEN', p .. 'groups') == 1
     and redis.call('HGET', p .. 'meta', 'paused') ~= '1' then
    fan_out(p, {a[1]})
  end
  return added
end)

-- topic_paused: 0/1 (shared); unpaused, the backlog goes to every group
redis.register_function('gw_topic_paused', function(keys, a)
  local p = keys[1]
  redis.call('HSET', p .. 'meta', 'paused', a[1])
  if a[1] == '0' then
    local groups = current_groups(p)
    if #groups > 0 then fan_out(p, groups) end
  end
  return 1
end)

redis.register_function('gw_clear', function(keys, a)
  drop_all(keys[1], a[1])
  return 1
end)

redis.register_function('gw_drop_group', function(keys, a)
  drop_all(keys[1], a[1])
  return redis.call('HDEL', keys[1] .. 'groups', a[1])
end)

redis.register_function('gw_drop_topic', function(keys, a)
  local p = keys[1]
  for _, g in ipairs(redis.call('HKEYS', p .. 'groups')) do drop_all(p, g) end
  drop_all(p, '')
  redis.call('DEL', p .. 'groups', p .. 'm', p .. 'n', p .. 'x', p .. 'seq', p .. 'meta',
             p .. 'fresh', p .. 'w', p .. 'put', p .. 'held')
  return 1
end)
"""

# the library: the steps above that change a queue, then those that read and claim
LIBRARY = LIBRARY + CLAIMS
