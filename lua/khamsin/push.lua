-- khamsin.push: the per-worker registry of push targets (SSE streams, WebSocket connections)
-- that k.send_to(id, data) reaches from anywhere: another request, a timer, a pool result, a
-- subscriber, another worker. An id is "<worker>-<gen>-<n>": the worker that holds the target
-- and the app instance (generation, kh_app.h) whose registry has it, so a send from another
-- worker, or from this worker's other instance (a hot reload replaced the one that holds the
-- stream: it serves it until it closes), goes straight to that instance's mailbox
-- (core.post_send_to) and is delivered there by the "send_to" event. A target is any table with a method
-- target:_push(data) -> true | nil, err that never yields (it applies stream_out_cap and ends a
-- slow consumer itself). Register with push.register(target) -> id, n; push.unregister(id or n)
-- when it closes. Nothing here is shared between workers.
-- Memory (issue 10, an idle WebSocket): a target takes a slot of an array, not a string key of a
-- hash: the number in its id is slot + SLOTS * use (the how-manieth use of that slot), so a
-- stale id never reaches the slot's next target, and the id string is made only when asked for
-- (push.id(n): ws.id).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, tonumber, match, tostring, fmod, format =
    type, tonumber, string.match, tostring, math.fmod, string.format

local M = {}

local SLOTS = 4194304 -- 2^22 targets at once per worker (connections per worker: 100,000)
-- slot -> target, or false when free (false keeps the array part dense); slot -> its uses;
-- the free slots, a stack
local targets, uses, free = {}, {}, {}
local top, nfree = 0, 0
local wid, gen

local function prefix()
    wid = wid or core.worker_id()
    gen = gen or core.gen()
    return wid .. "-" .. gen .. "-"
end

-- the id of number n
function M.id(n)
    return prefix() .. format("%.0f", n)
end

function M.register(target)
    local slot
    if nfree > 0 then
        slot = free[nfree]
        free[nfree] = nil
        nfree = nfree - 1
    else
        if top + 1 >= SLOTS then raise("k.send_to: more than " .. SLOTS .. " targets on one worker") end
        top = top + 1
        slot = top
        uses[slot] = 0
    end
    local u = uses[slot] + 1
    uses[slot] = u
    targets[slot] = target
    local n = u * SLOTS + slot
    return M.id(n), n
end

-- the slot of number n when it is still n's
local function slot_of(n)
    local slot = fmod(n, SLOTS)
    if slot < 1 or slot > top or uses[slot] * SLOTS + slot ~= n or not targets[slot] then
        return nil
    end
    return slot
end

local function number_of(id)
    if type(id) == "number" then return id end
    local n = match(tostring(id), "^%d+%-%d+%-(%d+)$")
    return n and tonumber(n)
end

function M.unregister(id)
    local n = number_of(id)
    local slot = n and slot_of(n)
    if not slot then return end
    targets[slot] = false
    nfree = nfree + 1
    free[nfree] = slot
end

function M.get(id)
    local n = number_of(id)
    local slot = n and slot_of(n)
    return slot and targets[slot] or nil
end

-- Delivers on this worker: true | nil, "gone" (no such target: it closed) | the target's error.
function M.deliver(id, data)
    local t = M.get(id)
    if not t then return nil, "gone" end
    return t:_push(data)
end

-- k.send_to(id, data): never yields. In this instance: the target's result. In another worker
-- or instance: true once posted (the delivery there may still find the target gone), nil, why
-- when the worker does not exist (an instance already closed drops the message: its streams
-- are gone).
function M.send_to(id, data)
    if type(id) ~= "string" then
        raise("k.send_to(id, data): id must be a string (sse.id, ws.id), got a " .. type(id))
    end
    local w, g = match(id, "^(%d+)%-(%d+)%-%d+$")
    if not w then raise("k.send_to(id, data): '" .. id .. "' is not a stream id (sse.id, ws.id)") end
    w, g = tonumber(w), tonumber(g)
    if not wid then prefix() end
    if w == wid and g == gen then return M.deliver(id, data) end
    local ok, err = core.post_send_to(w, g, id, data)
    if ok == false then raise(err) end
    if not ok then return nil, err end
    return true
end

-- The mailbox event on the target's worker.
function M.on_message(id, data)
    M.deliver(id, data)
end

-- How many targets this worker holds (specs, stats).
function M.count()
    return top - nfree
end

return M
