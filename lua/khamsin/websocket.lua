-- khamsin.websocket: k.websocket(path, {open=, message=, close=}) over HTTP/1.1 (GET + Upgrade,
-- RFC 6455) and HTTP/2 (extended CONNECT, RFC 8441), which reach the same route (the tunnel kind
-- "@websocket", core/kh_router.h). The frame codec is C (core/kh_ws.c through lua/kh_lua_ws.c);
-- this file does the handshake checks, the reader loop and the ws object.
--
-- One socket = the request's coroutine reading the tunnel (core.body_chunk, which yields; h1
-- stops reading / h2 holds the window back when it does not read). Each chunk is fed to the
-- codec, which answers pings, checks frames and returns whole messages, at most ws_queue per
-- call (then it pauses and the rest of the chunk waits). Each message runs in a coroutine of its
-- own, one after the other, so the messages of one socket are handled in order; while a handler
-- waits (k.sleep, ws:send above the high-water mark...) the socket is not read, which is the
-- bounded inbound queue. The ws object is a push target (khamsin.push): k.send_to(ws.id, data)
-- reaches it from anywhere; a send from anything but its own handlers never waits, and a socket
-- with stream_out_cap bytes already queued is closed with 1008 instead (a slow consumer never
-- holds memory without bound, nor stalls a k.publish to the others).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise
local push = require "khamsin.push"

local type, pairs, ipairs, setmetatable, rawget, rawset, tostring, xpcall, traceback =
    type, pairs, ipairs, setmetatable, rawget, rawset, tostring, xpcall, debug.traceback
local sub, lower, gmatch = string.sub, string.lower, string.gmatch
-- coroutine.resume is khamsin.coroutine's (installed before the app, so before this module
-- loads): engine waits inside a message handler pass up through it
local co_create, co_resume, co_running = coroutine.create, coroutine.resume, coroutine.running

local ws_codec, ws_feed, ws_frame, ws_close, ws_state =
    core.ws_codec, core.ws_feed, core.ws_frame, core.ws_close, core.ws_state
local write, finish, body_chunk = core.stream_write, core.stream_finish, core.body_chunk

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
        return nil, "closed"
    end
    return nil, err or "closed"
end

local function own(ws)
    local co = co_running()
    return co ~= nil and (co == ws._reader or co == ws._handler)
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

local function call(ws, fn, ...)
    local ok, e = xpcall(fn, traceback, ws, ...)
    if not ok and not errors.is_aborted(e) then log_error("websocket handler", e) end
    return ok
end

-- one message in a coroutine of its own; engine waits pass through it (khamsin.coroutine)
local function run_message(ws, fn, data, binary)
    local co = co_create(call)
    ws._handler = co
    co_resume(co, ws, fn, data, binary)
    ws._handler = nil
end

local function serve(h, opts, req, res)
    local limits = core.ws_limits()
    local version = header(req, "sec-websocket-version")
    if not version or not core.ws_version_ok(version) then
        return reject(426, "Upgrade Required: Sec-WebSocket-Version 13",
            { ["Sec-WebSocket-Version"] = "13" })
    end
    local out = {}
    if req.version == "1.1" or req.version == "1.0" then
        local key = header(req, "sec-websocket-key")
        local accept = key and core.ws_accept(key)
        if not accept then return reject(400, "Bad Request: Sec-WebSocket-Key") end
        out["Sec-WebSocket-Accept"] = accept
    end
    if not origin_ok(opts.origin, header(req, "origin"), req) then
        return reject(403, "Forbidden: Origin")
    end
    local bits = 0
    local ext = header(req, "sec-websocket-extensions")
    if ext and limits.deflate then
        local resp, b = core.ws_pmd(ext)
        if resp then out["Sec-WebSocket-Extensions"], bits = resp, b end
    end
    if opts.protocols then
        local offered = header(req, "sec-websocket-protocol")
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
    local s, g = res._s, res._g
    local ok, err = core.respond(s, g, 200, nil, out, nil, "tunnel") -- 101 on h1, 200 on h2
    if ok == false then raise(err) end
    rawset(res, "_deferred", true) -- the handler answered (101 / 200): nothing more to send
    if not ok then return end

    local ws = setmetatable({
        _s = s, _g = g, _reader = co_running(),
        _codec = ws_codec(limits.message_bytes, limits.frame_bytes, bits),
        protocol = out["Sec-WebSocket-Protocol"], req = req,
    }, ws_mt)
    ws.id = push.register(ws)
    if h.open then call(ws, h.open, req) end
    -- the request head's arena is given back (memory of an idle socket): req is for open();
    -- what it read of req stays in the req table, the rest reads as empty afterwards
    core.stream_hold(s, g)

    local list, queue, message = {}, limits.queue, h.message
    while not ws._done do
        local chunk = body_chunk(s, g)
        if chunk == true then goto continue end -- woken: ask again
        if type(chunk) ~= "string" then break end -- the end of input, or the peer left
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
    if not ws._close_code then ws._close_code = 1006 end -- no close frame
    ws._done = true
    finish(s, g)
    push.unregister(ws.id)
    if ws._topics then for t in pairs(ws._topics) do ws:unsubscribe(t) end end
    if h.close then call(ws, h.close, ws._close_code) end
end

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
