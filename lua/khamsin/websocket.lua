-- khamsin.websocket: k.websocket(path, {open=, message=, close=}) over HTTP/1.1 (GET + Upgrade,
-- RFC 6455) and HTTP/2 (extended CONNECT, RFC 8441), which reach the same route (the tunnel kind
-- "@websocket", core/kh_router.h). The frame codec is C (core/kh_ws.c through lua/kh_lua_ws.c);
-- this file does the handshake checks, the reader loop and the ws object.
--
-- One socket, between messages, keeps no coroutine: after the handshake and open() the engine
-- holds the stream (core.defer_hold + core.stream_hold: the request head's memory goes back) and
-- the request's coroutine ends; each arrival of bytes starts a reader coroutine that owns the
-- stream (lua/kh_lua_sched.c, KH_WAIT_TUNNEL; the "tunnel" event, khamsin.lua), which reads what
-- is there (core.body_chunk(s, g, true), never waiting for input) and ends (h1 stops reading /
-- h2 holds the window back while nobody consumes). Each chunk is fed to the codec, which answers
-- pings, checks frames and returns whole messages, at most ws_queue per call (then it pauses and
-- the rest of the chunk waits). Each message runs in a coroutine of its own, one after the
-- other, so the messages of one socket are handled in order; while a handler waits (k.sleep,
-- ws:send above the high-water mark...) the reader waits with it and the socket is not read,
-- which is the bounded inbound queue. The socket's end (close handshake, the peer leaving, the
-- close timeout, a slow consumer) runs the close handler once, from the reader if one runs,
-- else from the abort event or a callback of its own. What an idle socket keeps: its ws table
-- (at most 8 hash slots), the codec userdata, the req table with what open() read, and its
-- entries in the push, held and hold registries (bench/README.md, "memory per idle
-- WebSocket"). The ws object is a push target (khamsin.push): k.send_to(ws.id, data)
-- reaches it from anywhere; a send from anything but its own handlers never waits, and a socket
-- with stream_out_cap bytes already queued is closed with 1008 instead (a slow consumer never
-- holds memory without bound, nor stalls a k.publish to the others).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise
local push = require "khamsin.push"
local held = require("khamsin.stream").held

local type, pairs, ipairs, setmetatable, rawget, rawset, tostring, xpcall, traceback =
    type, pairs, ipairs, setmetatable, rawget, rawset, tostring, xpcall, debug.traceback
local sub, lower, gmatch, remove = string.sub, string.lower, string.gmatch, table.remove
-- coroutine.resume is khamsin.coroutine's (installed before the app, so before this module
-- loads): engine waits inside a message handler pass up through it
local co_create, co_resume, co_running = coroutine.create, coroutine.resume, coroutine.running

local ws_codec, ws_feed, ws_frame, ws_close, ws_state =
    core.ws_codec, core.ws_feed, core.ws_frame, core.ws_close, core.ws_state
local write, finish, body_chunk = core.stream_write, core.stream_finish, core.body_chunk
local core_header = core.header

local OP_TEXT, OP_BINARY, OP_PING = 1, 2, 9

local M = {}

local function log_error(what, e)
    core.log(0, what .. " failed: " .. tostring(e))
end

-- ---- the ws object ----

local ws_mt = {}
ws_mt.__index = ws_mt

-- Writes frame bytes. own: the caller is one of this socket's handlers (it may wait for the
-- queue to drain); anyone else never waits, and past stream_out_cap the socket is closed 1008.
local function put(ws, bytes, own)
    if ws._done then return nil, "closed" end
    local ok, err = write(ws._s, ws._g, bytes, own and "wait" or "push")
    if ok == true then return true end
    if err == "full" then
        -- the slow consumer: say why, then end it (the close frame may never be read)
        -- (in "wait" mode: past the cap "push" would refuse it; a sender that is not the
        -- socket's own handler never waits)
        local cf = ws_close(ws._codec, 1008, "slow consumer")
        if cf then write(ws._s, ws._g, cf, "wait") end
        ws._close_code, ws._close_reason = 1008, "slow consumer"
        finish(ws._s, ws._g, true) -- cut: h2 resets the stream, dropping what is queued
        ws._done = true
        -- the close handler runs later, in a callback of its own: not inside this send (a
        -- k.publish walking its subscribers, another socket's handler)
        core.timer(0, nil, function() M._ended(ws) end)
        return nil, "closed"
    end
    return nil, err or "closed"
end

-- the message handler's coroutine -> its socket, while it runs (no field in the ws table: an
-- idle socket's table stays within 8 hash slots)
local handler_of = setmetatable({}, { __mode = "k" })

local function own(ws)
    local co = co_running()
    return co ~= nil and (co == ws._reader or handler_of[co] == ws)
end

-- ws:send(data[, binary]) -> true | nil, "closed"
function ws_mt.send(ws, data, binary)
    if type(ws) ~= "table" or rawget(ws, "_codec") == nil then
        raise("ws:send(data[, binary]): call it with ':'")
    end
    local t = type(data)
    if t == "number" then
        data = tostring(data)
    elseif t ~= "string" then
        raise("ws:send(data[, binary]): data must be a string, got a " .. t)
    end
    if ws._closing then return nil, "closed" end
    return put(ws, ws_frame(ws._codec, binary and OP_BINARY or OP_TEXT, data), own(ws))
end

-- ws:ping([data]) -> true | nil, "closed" (the codec answers the peer's pings by itself)
function ws_mt.ping(ws, data)
    data = data or ""
    if type(data) ~= "string" or #data > 125 then
        raise("ws:ping([data]): data is a string of at most 125 bytes")
    end
    if ws._closing then return nil, "closed" end
    return put(ws, ws_frame(ws._codec, OP_PING, data), own(ws))
end

-- ws:close([code[, reason]]): starts the close handshake; the close callback runs once the
-- peer answered (or after ws_close_timeout_ms).
function ws_mt.close(ws, code, reason)
    code = code or 1000
    if type(code) ~= "number" or not core.ws_close_code_ok(code) or code == 1005
        or (code > 1003 and code < 3000 and code ~= 1007 and code ~= 1008 and code ~= 1009
            and code ~= 1010 and code ~= 1011) then
        raise("ws:close(code, reason): code " .. tostring(code) .. " cannot be sent (1000-1003, "
            .. "1007-1011, 3000-4999)")
    end
    reason = reason or ""
    if type(reason) ~= "string" or #reason > 123 then
        raise("ws:close(code, reason): reason is a string of at most 123 bytes")
    end
    if ws._closing or ws._done then return true end
    ws._closing = true
    local cf = ws_close(ws._codec, code, reason)
    if cf then write(ws._s, ws._g, cf, "wait") end
    local s, g = ws._s, ws._g
    core.timer(core.ws_limits().close_timeout, nil, function()
        if not ws._done then
            ws._close_code = ws._close_code or 1006
            ws._done = true
            finish(s, g)
            M._ended(ws)
        end
    end)
    return true
end

-- ws:subscribe(topic): every k.publish(topic, data) on any worker is sent to this socket
-- (a string as text; anything else is an error in the publisher's value and is skipped).
local topics = {}
local function topic_fn(topic)
    return function(value)
        local set = topics[topic]
        if not set or type(value) ~= "string" then return end
        for ws in pairs(set) do ws:_push(value) end
    end
end

function ws_mt.subscribe(ws, topic)
    if type(topic) ~= "string" then raise("ws:subscribe(topic): topic must be a string") end
    local set = topics[topic]
    if not set then
        set = setmetatable({}, { __mode = "k" })
        topics[topic] = set
        require("khamsin").subscribe(topic, topic_fn(topic))
    end
    set[ws] = true
    ws._topics = ws._topics or {}
    ws._topics[topic] = true
end

function ws_mt.unsubscribe(ws, topic)
    local set = topics[topic]
    if set then set[ws] = nil end
    if ws._topics then ws._topics[topic] = nil end
end

-- push target (khamsin.push): never yields
function ws_mt._push(ws, data)
    if type(data) ~= "string" then data = tostring(data) end
    if ws._closing then return nil, "closed" end
    return put(ws, ws_frame(ws._codec, OP_TEXT, data), false)
end

-- ---- the handshake ----

local function header(req, name)
    local v = req.headers[name]
    if type(v) == "table" then v = v[1] end
    return v
end

local function reject(status, text, headers)
    return status, text .. "\n", headers
end

local function origin_ok(opt, origin, req)
    if opt == nil then return true end
    if type(opt) == "string" then return origin == opt end
    if type(opt) == "table" then
        for _, o in ipairs(opt) do if o == origin then return true end end
        return false
    end
    return opt(origin, req) and true or false
end

-- ---- the socket ----

local spare_lists = {} -- drain's message lists, empty, for the next one
local QUEUE -- ws_queue (limits are the process's: the same for every socket)

local function call(ws, fn, ...)
    local ok, e = xpcall(fn, traceback, ws, ...)
    if not ok and not errors.is_aborted(e) then log_error("websocket handler", e) end
    return ok
end

-- one message in a coroutine of its own; engine waits pass through it (khamsin.coroutine)
local function run_message(ws, fn, data, binary)
    local co = co_create(call)
    handler_of[co] = ws
    co_resume(co, ws, fn, data, binary)
    handler_of[co] = nil
end

-- The socket is over (close handshake done, the peer left, a slow consumer, the close
-- timeout): once, in whichever coroutine sees it first while no reader runs (a running reader
-- does it as it ends). The stream's hold is released and the close handler runs.
local function ended(ws)
    if ws._ended then return end
    if ws._reader then ws._end_pending = true return end
    ws._ended = true
    if not ws._close_code then ws._close_code = 1006 end -- no close frame
    ws._done = true
    local s, g = ws._s, ws._g
    finish(s, g)
    push.unregister(ws.id)
    if ws._topics then for t in pairs(ws._topics) do ws:unsubscribe(t) end end
    -- the engine's hold (core.defer_hold); the abort event has taken it out of held already.
    -- defer_release checks the generation and that a hold is there: safe when there was none
    if held[s] == ws then held[s] = nil end
    core.defer_release(s, g)
    local h = ws._h
    if h.close then call(ws, h.close, ws._close_code) end
end

-- Reads what the tunnel has now (never waits for input): each chunk to the codec, each message
-- to the message handler, in order. Runs in a coroutine that owns the stream (the request's
-- own right after the handshake, then one started by each arrival: the "tunnel" event).
local function drain(ws)
    local s, g = ws._s, ws._g
    local message, queue = ws._h.message, QUEUE
    local list = remove(spare_lists) or {} -- (garbage per wake-up: RSS after a burst)
    ws._reader = co_running()
    while not ws._done do
        local chunk, err = body_chunk(s, g, true)
        if chunk == true then goto continue end -- woken: ask again
        if type(chunk) ~= "string" then
            if err ~= "wait" then ws._done = true end -- the end of input, or the peer left
            break
        end
        do
            local pos = 1
            while true do
                local st, used, _, code = ws_feed(ws._codec, pos == 1 and chunk or sub(chunk, pos), list, queue)
                for i = 1, #list, 2 do
                    local data, tag = list[i], list[i + 1]
                    list[i], list[i + 1] = nil, nil
                    if tag == 0 then -- a pong or close frame of the codec's, in order
                        if not ws._done then write(s, g, data, "push") end
                    elseif message and not ws._done then
                        run_message(ws, message, data, tag)
                    end
                end
                if st == "closed" then
                    ws._close_code = code
                    ws._done = true
                    break
                end
                if st == "ok" then break end
                pos = pos + used
            end
        end
        ::continue::
    end
    ws._reader = false
    if list[1] == nil then spare_lists[#spare_lists + 1] = list end
    if ws._done or ws._end_pending then ended(ws) end
end

-- held-stream hooks (khamsin.stream.held; khamsin.lua's "tunnel" and "abort" events)
function ws_mt._readable(ws, g)
    if g == ws._g then drain(ws) end
end

function ws_mt._aborted(ws)
    ws._done = true
    ended(ws)
end

-- request headers one by one (core.header): no req.headers table is built, so what an idle
-- socket keeps of its request is only what open() read (README "WebSocket")
local function hdr(req, s, g, name)
    if rawget(req, "headers") then return header(req, name) end
    return core_header(s, g, name)
end

local LIMITS

local function serve(h, opts, req, res)
    local limits = LIMITS
    if not limits then
        limits = core.ws_limits()
        LIMITS, QUEUE = limits, limits.queue
    end
    local s, g = res._s, res._g
    local version = hdr(req, s, g, "sec-websocket-version")
    if not version or not core.ws_version_ok(version) then
        return reject(426, "Upgrade Required: Sec-WebSocket-Version 13",
            { ["Sec-WebSocket-Version"] = "13" })
    end
    local out = {}
    -- HTTP/1.x without req.version (which would keep the whole head in the req table)
    local _, major = core.tunnel(s, g)
    if major ~= 2 and major ~= 3 then
        local key = hdr(req, s, g, "sec-websocket-key")
        local accept = key and core.ws_accept(key)
        if not accept then return reject(400, "Bad Request: Sec-WebSocket-Key") end
        out["Sec-WebSocket-Accept"] = accept
    end
    if opts.origin ~= nil and not origin_ok(opts.origin, hdr(req, s, g, "origin"), req) then
        return reject(403, "Forbidden: Origin")
    end
    local bits = 0
    local ext = hdr(req, s, g, "sec-websocket-extensions")
    if ext and limits.deflate then
        local resp, b = core.ws_pmd(ext)
        if resp then out["Sec-WebSocket-Extensions"], bits = resp, b end
    end
    if opts.protocols then
        local offered = hdr(req, s, g, "sec-websocket-protocol")
        if offered then
            for p in gmatch(offered, "[^,%s]+") do
                for _, mine in ipairs(opts.protocols) do
                    if p == mine and not out["Sec-WebSocket-Protocol"] then
                        out["Sec-WebSocket-Protocol"] = p
                    end
                end
            end
        end
    end
    local ok, err = core.respond(s, g, 200, nil, out, nil, "tunnel") -- 101 on h1, 200 on h2
    if ok == false then raise(err) end
    rawset(res, "_deferred", true) -- the handler answered (101 / 200): nothing more to send
    if not ok then return end

    -- few fields (a table of at most 8 hash slots): an idle socket keeps this table
    local ws = setmetatable({
        _s = s, _g = g, _h = h, _codec = ws_codec(limits.message_bytes, limits.frame_bytes, bits),
        protocol = out["Sec-WebSocket-Protocol"], req = req, id = false, _reader = false,
    }, ws_mt)
    ws.id = push.register(ws)
    ws._reader = co_running() -- open() is one of its own handlers
    if h.open then call(ws, h.open, req) end
    ws._reader = false
    -- between messages no coroutine waits for the socket: the engine holds the stream
    -- (defer_hold) and starts a reader for each arrival (KH_WAIT_TUNNEL, lua/kh_lua_sched.c);
    -- the request head's arena is given back (stream_hold): req is for open(); what it read
    -- of req stays in the req table, the rest reads as empty afterwards
    if not ws._done and core.defer_hold(s, g) then
        held[s] = ws
        core.stream_hold(s, g)
    else
        ws._done = true
    end
    drain(ws) -- what came with or right after the handshake
end

M._ended = ended

-- k.websocket(path, handlers[, opts])
function M.route(add, path, h, opts)
    if type(h) ~= "table" then
        raise("k.websocket(path, handlers): handlers is a table {open=, message=, close=}")
    end
    for key, v in pairs(h) do
        if key ~= "open" and key ~= "message" and key ~= "close" and key ~= "origin"
            and key ~= "protocols" then
            raise("k.websocket(path, handlers): unknown key '" .. tostring(key) .. "' (open, "
                .. "message, close, origin, protocols)")
        end
        if (key == "open" or key == "message" or key == "close") and type(v) ~= "function" then
            raise("k.websocket(path, handlers): " .. key .. " must be a function, got a " .. type(v))
        end
    end
    local o = h.origin
    if o ~= nil and type(o) ~= "string" and type(o) ~= "table" and type(o) ~= "function" then
        raise("k.websocket: origin is a string, a list of strings or a function(origin, req)")
    end
    if h.protocols ~= nil and type(h.protocols) ~= "table" then
        raise("k.websocket: protocols is a list of strings")
    end
    local opts_ = { origin = o, protocols = h.protocols }
    add("k.websocket", "@websocket", path, function(req, res) return serve(h, opts_, req, res) end)
end

return M
