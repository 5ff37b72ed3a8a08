-- khamsin.push: the per-worker registry of push targets (SSE streams, WebSocket connections)
-- that k.send_to(id, data) reaches from anywhere: another request, a timer, a pool result, a
-- subscriber, another worker. An id is "<worker>-<gen>-<n>": the worker that holds the target
-- and the app instance (generation, kh_app.h) whose registry has it, so a send from another
-- worker, or from this worker's other instance (a hot reload replaced the one that holds the
-- stream: it serves it until it closes), goes straight to that instance's mailbox
-- (core.post_send_to) and is delivered there by the "send_to" event. A target is any table with a method
-- target:_push(data) -> true | nil, err that never yields (it applies stream_out_cap and ends a
-- slow consumer itself). Register with push.register(target) -> id; push.unregister(id) when it
-- closes. Nothing here is shared between workers.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, tonumber, match = type, tonumber, string.match

local M = {}

local targets = {}
local seq = 0
local wid, gen

function M.register(target)
    wid = wid or core.worker_id()
    gen = gen or core.gen()
    seq = seq + 1
    local id = wid .. "-" .. gen .. "-" .. seq
    targets[id] = target
    return id
end

function M.unregister(id)
    targets[id] = nil
end

function M.get(id) return targets[id] end

-- Delivers on this worker: true | nil, "gone" (no such target: it closed) | the target's error.
function M.deliver(id, data)
    local t = targets[id]
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
    wid = wid or core.worker_id()
    gen = gen or core.gen()
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
    local n = 0
    for _ in pairs(targets) do n = n + 1 end
    return n
end

return M
