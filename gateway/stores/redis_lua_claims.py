"""The second half of the Redis store's function library (redis_lua.py holds the first,
with the layout): the steps that read queues, claim messages for delivery and find one
message wherever it is. Lua, concatenated after the first half, whose local helpers
(fields, find, packed, place, materialize, ...) it uses."""

from __future__ import annotations

CLAIMS = r"""
-- one message, flat (id attempts prio packed [extra]) onto `out`, if group g holds it;
-- returns the batch looked up, for the next call
local function entry(p, g, id, out, cur, extra)
  local attempts, prio, b = fields(p, g, id, cur)
  if attempts == nil then return b end
  b = find(p, id, b)
  out[#out + 1] = id
  out[#out + 1] = attempts
  out[#out + 1] = prio
  out[#out + 1] = b and packed(p, b, id) or ''
  if extra then out[#out + 1] = extra end
  return b
end

-- snapshot: group window (-1: all, 0: none) -> {spilled, ready[], deferred[], buried[], claimed}
-- ready/deferred/buried entries are flat (id attempts prio packed [due])
redis.register_function('gw_snapshot', function(keys, a)
  local p, g, window = keys[1], a[1], tonumber(a[2])
  local ready, deferred, buried = {}, {}, {}
  local r = p .. 'r:' .. g
  materialize(p, g)
  local total = redis.call('ZCARD', r)
  local members = {}
  if window ~= 0 then members = redis.call('ZRANGE', r, 0, window > 0 and window - 1 or -1) end
  local cur = nil
  for _, mem in ipairs(members) do cur = entry(p, g, string.sub(mem, 9), ready, cur) end
  local d = redis.call('ZRANGE', p .. 'd:' .. g, 0, -1, 'WITHSCORES')
  for i = 1, #d, 2 do cur = entry(p, g, d[i], deferred, cur, d[i + 1]) end
  for _, id in ipairs(redis.call('ZRANGE', p .. 'b:' .. g, 0, -1)) do
    cur = entry(p, g, id, buried, cur)
  end
  return {total - #members, ready, deferred, buried, claimed_count(p, g)}
end)

-- load: group from_member limit -> flat (id attempts prio packed) in (priority, id) order
redis.register_function('gw_load', function(keys, a)
  local p, g = keys[1], a[1]
  local out, cur = {}, nil
  materialize(p, g)
  local members = redis.call('ZRANGEBYLEX', p .. 'r:' .. g, '[' .. a[2], '+', 'LIMIT', 0, a[3])
  for _, mem in ipairs(members) do cur = entry(p, g, string.sub(mem, 9), out, cur) end
  return out
end)

-- Move what is due back to ready: deferred messages whose time came, and claims whose
-- deadline passed (a gateway that died, or a consumer that never answered). The attempt
-- was counted when the message was delivered, so the next delivery shows attempts + 1.
local function promote(p, g, now)
  local d = p .. 'd:' .. g
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', d, '-inf', now, 'LIMIT', 0, 1000)) do
    local _, prio = fields(p, g, id)
    redis.call('ZREM', d, id)
    if prio then place(p, g, id, prio, 'r', 0) end
  end
  local f = p .. 'f:' .. g
  local expired = redis.call('ZRANGEBYSCORE', f, '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(expired) do
    local _, prio = fields(p, g, id)
    redis.call('ZREM', f, id)
    redis.call('HDEL', p .. 'o:' .. g, id)
    if prio then place(p, g, id, prio, 'r', 0) end
  end
  local n = #expired
  local e = p .. 'e:' .. g
  for _, mem in ipairs(redis.call('ZRANGEBYSCORE', e, '-inf', now, 'LIMIT', 0, 100)) do
    n = n + dissolve(p, g, parse_claim(mem), true)
  end
  return n
end

local function next_due(p, g)
  local nxt = -1
  for _, k in ipairs({p .. 'd:' .. g, p .. 'f:' .. g, p .. 'e:' .. g}) do
    local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if first[2] then
      local t = tonumber(first[2])
      if nxt < 0 or t < nxt then nxt = t end
    end
  end
  return nxt
end

-- The first n ready messages of group g in (priority, id) order, merged from r (placed
-- one by one) and the ranges of q (a range's ids are never in r, so comparing its next
-- id with r's head is enough). Changes nothing. Returns them in that order as `seq`,
-- whose items are an id of r (a string) or a run of consecutive ids from ranges ({first,
-- last} numbers; runs of adjacent publishes joined), and what a claim of them must
-- change: the members of r taken, the ranges used up, how many came from ranges, and
-- the member that replaces a range taken in part (nil: none). Work per run, not per id.
local function ready_head(p, g, n)
  local singles = n > 0 and redis.call('ZRANGE', p .. 'r:' .. g, 0, n - 1) or {}
  -- ranges are read a few at a time: each holds a whole publish, so a claim of
  -- hundreds of messages mostly needs a handful of them
  local q, ranges, page, more = p .. 'q:' .. g, {}, 8, n > 0
  local seq, taken, spent, fresh = {}, {}, {}, 0
  local i, j = 1, 0
  local pre, at, last, from
  local function next_range()
    j = j + 1
    if j > #ranges and more then
      local got = redis.call('ZRANGE', q, #ranges, #ranges + page - 1)
      for _, mem in ipairs(got) do ranges[#ranges + 1] = mem end
      more = #got == page
      page = math.min(page * 2, 512)
    end
    local mem = ranges[j]
    if mem then
      pre, at = string.sub(mem, 1, 8), tonumber(string.sub(mem, 9, 24), 16)
      last, from = tonumber(string.sub(mem, 26, 41), 16), at
    end
  end
  next_range()
  local got = 0
  while got < n do
    local single = singles[i]
    if not single and not ranges[j] then break end
    if ranges[j] and (not single or pre .. hex(at) < single) then
      -- the range up to its end, to n, or (same priority) to the single's id
      local upto = math.min(last, at + n - got - 1)
      if single and string.sub(single, 1, 8) == pre then
        upto = math.min(upto, tonumber(string.sub(single, 9), 16) - 1)
      end
      local run = seq[#seq]
      if type(run) == 'table' and run[2] + 1 == at then
        run[2] = upto
      else
        seq[#seq + 1] = {at, upto}
      end
      got = got + upto - at + 1
      fresh = fresh + upto - at + 1
      at = upto + 1
      if at > last then
        spent[#spent + 1] = ranges[j]
        next_range()
      end
    else
      seq[#seq + 1] = string.sub(single, 9)
      taken[#taken + 1] = single
      i = i + 1
      got = got + 1
    end
  end
  local rest = nil
  if ranges[j] and at > from then
    spent[#spent + 1] = ranges[j]
    rest = pre .. hex(at) .. ':' .. hex(last)
  end
  return seq, taken, spent, fresh, rest
end

-- claim: group n now_ms lease_ms owner -> {next_due_ms, expired, singles, runs}: the n
-- most urgent ready messages become claimed by `owner` until now + lease (the delivery
-- then sets the consumer's own deadline). A claim is made only for a delivery, so the
-- attempt is counted here already (the reply shows the count before it): a gateway
-- killed before it recorded the delivery still gives attempts + 1.
-- Messages placed one by one are claimed one by one (f, o, s) and come back flat, as
-- (id attempts prio packed). Those taken from the ranges of their publish become range
-- claims (a few writes per run of ids) and come back per run and batch as (batch first
-- last attempts prio), first and last as numbers: the gateway reads the batches' blobs
-- itself (HMGET of m) and cuts the bodies out. Nothing here is done per message, and no
-- blob passes through Lua (copying one in and out costs more than the rest of a claim).
redis.register_function('gw_claim', function(keys, a)
  local p, g, n, now, lease, owner = keys[1], a[1], tonumber(a[2]), tonumber(a[3]),
    tonumber(a[4]), a[5]
  local expired = promote(p, g, now)
  local seq, taken, spent, fresh, rest = ready_head(p, g, n)
  -- less than asked: this gateway waits for the topic's next publish (gw_put tells it)
  if #taken + fresh < n then redis.call('SADD', p .. 'w', owner) end
  local r, q = p .. 'r:' .. g, p .. 'q:' .. g
  if rest then redis.call('ZADD', q, 0, rest) end
  bulk('ZREM', r, taken)
  bulk('ZREM', q, spent)
  if fresh > 0 then
    redis.call('HINCRBY', p .. 'fresh', g, -fresh)
    redis.call('HINCRBY', p .. 'held', g, fresh)
  end
  local ids, runs = {}, {}
  for _, item in ipairs(seq) do
    if type(item) == 'table' then runs[#runs + 1] = item else ids[#ids + 1] = item end
  end
  local singles, cut = {}, {}
  local cur = nil
  for _, run in ipairs(runs) do
    local mem = hex(run[1]) .. ':' .. hex(run[2])
    redis.call('ZADD', p .. 'c:' .. g, 0, mem)
    redis.call('ZADD', p .. 'e:' .. g, now + lease, mem)
    redis.call('HSET', p .. 'k:' .. g, mem, owner)
    local id = run[1]
    while id <= run[2] do  -- one piece per batch the run crosses
      cur = find(p, hex(id), cur)
      if not cur then break end
      local upto = math.min(run[2], tonumber(cur.last, 16))
      cut[#cut + 1] = cur.first; cut[#cut + 1] = id; cut[#cut + 1] = upto
      cut[#cut + 1] = cur.attempts; cut[#cut + 1] = cur.prio
      id = upto + 1
    end
  end
  if #ids > 0 then
    local svals = hmget(p .. 's:' .. g, ids)
    local fs, os, ss = {}, {}, {}
    for i, id in ipairs(ids) do
      cur = find(p, id, cur)
      if cur then
        local attempts, prio = cur.attempts, cur.prio
        local v = svals[i]
        if v then
          local c = string.find(v, ':', 1, true)
          attempts, prio = tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1))
        end
        fs[#fs + 1] = now + lease; fs[#fs + 1] = id
        os[#os + 1] = id; os[#os + 1] = owner
        ss[#ss + 1] = id; ss[#ss + 1] = (attempts + 1) .. ':' .. prio
        singles[#singles + 1] = id; singles[#singles + 1] = attempts
        singles[#singles + 1] = prio; singles[#singles + 1] = packed(p, cur, id)
      end
    end
    bulk('ZADD', p .. 'f:' .. g, fs)
    bulk('HSET', p .. 'o:' .. g, os)
    bulk('HSET', p .. 's:' .. g, ss)
  end
  return {next_due(p, g), expired, singles, cut}
end)

-- touch: group owner then (id deadline_ms) pairs: claims' deadlines move, only their
-- owner's (a delivery, NSQ TOUCH, beanstalkd touch)
redis.register_function('gw_touch', function(keys, a)
  local p, g, owner = keys[1], a[1], a[2]
  local ids = {}
  for i = 3, #a, 2 do ids[#ids + 1] = a[i] end
  if #ids == 0 then return 0 end
  local holders = hmget(p .. 'o:' .. g, ids)
  local fs = {}
  for i, id in ipairs(ids) do
    if not holders[i] then  -- in a range claim: its own deadline needs its own entry
      local c = claim_of(p, g, id)
      if c and redis.call('HGET', p .. 'k:' .. g, c.member) == owner and detach(p, g, id) then
        holders[i] = owner
      end
    end
    if holders[i] == owner then fs[#fs + 1] = a[2 * i + 2]; fs[#fs + 1] = id end
  end
  bulk('ZADD', p .. 'f:' .. g, fs)
  return #fs / 2
end)

-- counts: group... -> per group {ready, deferred, claimed, buried, oldest buried as
-- (id attempts prio packed) or empty}
redis.register_function('gw_counts', function(keys, a)
  local p = keys[1]
  local out = {}
  for _, g in ipairs(a) do
    local head = {}
    local first = redis.call('ZRANGE', p .. 'b:' .. g, 0, 0)
    if first[1] then entry(p, g, first[1], head) end
    out[#out + 1] = {
      ready_count(p, g), redis.call('ZCARD', p .. 'd:' .. g),
      claimed_count(p, g), redis.call('ZCARD', p .. 'b:' .. g), head}
  end
  return out
end)

-- raise_ids: KEYS[1] = the id counter; never below a[1] (ids numbered by a caller)
redis.register_function('gw_raise_ids', function(keys, a)
  local cur = tonumber(redis.call('GET', keys[1]) or '0')
  if cur < tonumber(a[1]) then redis.call('SET', keys[1], a[1]) end
  return 1
end)

-- kick: group n -> how many moved to ready: the oldest burials first or, when none is
-- buried, the deferred messages due first (beanstalkd's kick)
redis.register_function('gw_kick', function(keys, a)
  local p, g = keys[1], a[1]
  local from = p .. 'b:' .. g
  if redis.call('ZCARD', from) == 0 then from = p .. 'd:' .. g end
  local ids = redis.call('ZRANGE', from, 0, tonumber(a[2]) - 1)
  -- a[3] '1': the kicked messages themselves, as entries (the archive records each)
  local out, cur = a[3] == '1' and {} or nil, nil
  for _, id in ipairs(ids) do
    local _, prio = fields(p, g, id)
    redis.call('ZREM', from, id)
    if prio then
      place(p, g, id, prio, 'r', 0)
      if out then cur = entry(p, g, id, out, cur) end
    end
  end
  return out or #ids
end)

-- One message by id, read only (nothing materialized): its state in group g, the
-- score that goes with it (claim deadline, due time, ms), the claiming gateway, and
-- its attempts and priority; nil when g does not hold it.
local function locate(p, g, id)
  local v = redis.call('HGET', p .. 's:' .. g, id)
  if v then
    local c = string.find(v, ':', 1, true)
    local attempts, prio = tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1))
    local at = redis.call('ZSCORE', p .. 'f:' .. g, id)
    if at then
      return 'reserved', at, redis.call('HGET', p .. 'o:' .. g, id) or '', attempts, prio
    end
    at = redis.call('ZSCORE', p .. 'd:' .. g, id)
    if at then return 'delayed', at, '', attempts, prio end
    if redis.call('ZSCORE', p .. 'b:' .. g, id) then return 'buried', 0, '', attempts, prio end
    return 'ready', 0, '', attempts, prio
  end
  local b = batch_of(p, id)
  if not b then return nil end
  local c = claim_of(p, g, id)
  if c and redis.call('GETBIT', bits_key(p, g, c), tonumber(id, 16) - c.f0) == 0 then
    return 'reserved', redis.call('ZSCORE', p .. 'e:' .. g, c.member),
      redis.call('HGET', p .. 'k:' .. g, c.member), b.attempts + 1, b.prio
  end
  local key = rkey(b.prio, id)
  local found = redis.call('ZSCORE', p .. 'r:' .. g, key)
  if not found then  -- in a range of its publish?
    local q = p .. 'q:' .. g
    local mem = redis.call('ZREVRANGEBYLEX', q, '(' .. key .. ';', '-', 'LIMIT', 0, 1)[1]
    local last = mem and string.sub(mem, 1, 8) .. string.sub(mem, 26, 41)
    found = mem and string.sub(mem, 1, 24) <= key and key <= last
  end
  if found then return 'ready', 0, '', b.attempts, b.prio end
  return nil
end

-- find: id group... -> {group, state, score, owner, id, attempts, prio, packed} for the
-- first of the groups that holds the message, or {}
redis.register_function('gw_find', function(keys, a)
  local p, id = keys[1], a[1]
  for i = 2, #a do
    local state, score, owner, attempts, prio = locate(p, a[i], id)
    if state then
      local b = find(p, id, nil)
      return {a[i], state, tostring(score), owner, id, attempts, prio, b and packed(p, b, id) or ''}
    end
  end
  return {}
end)

-- peek: group state limit -> flat (id attempts prio packed score) of the first `limit`
-- messages in that state, in the order they leave it: ready (priority, id), delayed
-- (due, score = due ms), buried (burial order), reserved (deadline, score = deadline)
redis.register_function('gw_peek', function(keys, a)
  local p, g, state, n = keys[1], a[1], a[2], tonumber(a[3])
  local out, cur, ids, scores = {}, nil, {}, {}
  if state == 'ready' then
    for _, item in ipairs((ready_head(p, g, n))) do
      if type(item) == 'table' then
        for id = item[1], item[2] do ids[#ids + 1] = hex(id) end
      else
        ids[#ids + 1] = item
      end
    end
  else
    local key = ({delayed = 'd:', buried = 'b:', reserved = 'f:'})[state]
    if not key or n <= 0 then return out end
    if state == 'reserved' then dissolve_all(p, g) end
    local got = redis.call('ZRANGE', p .. key .. g, 0, n - 1, 'WITHSCORES')
    for i = 1, #got, 2 do
      ids[#ids + 1] = got[i]
      scores[#ids] = got[i + 1]
    end
  end
  for i, id in ipairs(ids) do
    local v = redis.call('HGET', p .. 's:' .. g, id)
    cur = find(p, id, cur)
    if cur then
      local attempts, prio = cur.attempts, cur.prio
      if v then
        local c = string.find(v, ':', 1, true)
        attempts, prio = tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1))
      end
      out[#out + 1] = id; out[#out + 1] = attempts; out[#out + 1] = prio
      out[#out + 1] = packed(p, cur, id); out[#out + 1] = scores[i] or '0'
    end
  end
  return out
end)

-- claim_id: group id now_ms lease_ms owner -> (id attempts prio packed) or {}: one
-- particular message, ready, delayed or buried (not claimed by anyone), claimed by
-- `owner` for a delivery (beanstalkd reserve-job), its attempt counted as gw_claim does
redis.register_function('gw_claim_id', function(keys, a)
  local p, g, id, now, lease, owner = keys[1], a[1], a[2], tonumber(a[3]), tonumber(a[4]), a[5]
  local state = locate(p, g, id)
  if not state or state == 'reserved' then return {} end
  local attempts, prio, b = fields(p, g, id)  -- a message in a range: materialized here
  b = find(p, id, b)
  if not attempts or not b then return {} end
  unplace(p, g, id, prio)
  redis.call('HSET', p .. 's:' .. g, id, (attempts + 1) .. ':' .. prio)
  redis.call('ZADD', p .. 'f:' .. g, now + lease, id)
  redis.call('HSET', p .. 'o:' .. g, id, owner)
  return {id, attempts, prio, packed(p, b, id)}
end)
"""
