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
-- else from the abort event or a callback of its own.
-- The ws object is the codec's userdata (lua/kh_lua_ws.c), not a table: its state (stream,
-- generation, state bits, close code, push number, subprotocol index) is C fields of it, its
-- environment the route's table (handlers, subprotocols), and its metatable, shared by every
-- socket, this file's methods. ws.id, ws.protocol and ws.req are computed when read; what a
-- socket has only sometimes (its reader while one runs, topics, the req table when open()
-- read from it, fields the app set on ws) lives in weak side tables keyed by the object. So an
-- idle socket keeps, in the Lua heap, that userdata, its slot in khamsin.push and its entries
-- in the held and hold registries (bench/README.md, "memory per idle WebSocket").
-- The ws object is a push target (khamsin.push): k.send_to(ws.id, data)
-- reaches it from anywhere; a send from anything but its own handlers never waits, and a socket
-- with stream_out_cap bytes already queued is closed with 1008 instead (a slow consumer never
-- holds memory without bound, nor stalls a k.publish to the others).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise
local push = require "khamsin.push"
local held = require("khamsin.stream").held
local new_req = require("khamsin.request").new

local type, pairs, ipairs, next, setmetatable, rawget, rawset, tostring, xpcall, traceback, collectgarbage =
    type, pairs, ipairs, next, setmetatable, rawget, rawset, tostring, xpcall, debug.traceback, collectgarbage
local sub, gmatch, remove = string.sub, string.gmatch, table.remove
local band = bit.band
local ffi = require "ffi"
local cast = ffi.cast
-- coroutine.resume is khamsin.coroutine's (installed before the app, so before this module
-- loads): engine waits inside a message handler pass up through it
local co_create, co_resume, co_running = coroutine.create, coroutine.resume, coroutine.running

local ws_codec, ws_feed, ws_frame, ws_close = core.ws_codec, core.ws_feed, core.ws_frame, core.ws_close
local ws_st, ws_flag, ws_code, ws_pn, ws_env, ws_move =
    core.ws_st, core.ws_flag, core.ws_code, core.ws_pn, core.ws_env, core.ws_move
local write, finish, body_chunk = core.stream_write, core.stream_finish, core.body_chunk
local stream_compact = core.stream_compact
local core_header = core.header

local OP_TEXT, OP_BINARY, OP_PING = 1, 2, 9
-- the state bits of a ws object (core.ws_flag: set, never cleared)
local DONE, CLOSING, ENDED, PENDING, COMPACT = 1, 2, 4, 8, 16 -- (COMPACT: moved, or never will)

local M = {}

local function log_error(what, e)
    core.log(0, what .. " failed: " .. tostring(e))
end

-- ---- the ws object ----

local methods = {}
local weak = { __mode = "k" }
-- what a socket has only sometimes, by object (weak keys: none of them keeps a socket alive)
local reader_of = setmetatable({}, weak) -- the coroutine that reads it, while one runs
local topics_of = setmetatable({}, weak) -- topic -> true, once it subscribed
local req_of = setmetatable({}, weak)    -- the req table, when open() (or middleware) read from it
local fields_of = setmetatable({}, weak) -- fields the app set on it (ws.name = ...)

local push_id = push.id -- (not the push module: spec/meta_spec.lua reads __index's upvalues)
local ws_mt = core.ws_meta() -- the codec's metatable (its __gc frees the codec's buffers)
ws_mt.__index = function(ws, key)
    local m = methods[key]
    if m then return m end
    if key == "id" then
        local n = ws_pn(ws)
        return n ~= 0 and push_id(n) or nil
    elseif key == "protocol" then
        local env, i = ws_env(ws)
        return i ~= 0 and env.opts.protocols[i] or nil
    elseif key == "req" then
        local req = req_of[ws]
        if req == nil then
            local s, g = ws_st(ws)
            req = new_req(s, g) -- reads as the held stream reads: method and path
            req_of[ws] = req
        end
        return req
    end
    local f = fields_of[ws]
    return f and f[key]
end
ws_mt.__newindex = function(ws, key, value)
    if key == "id" or key == "protocol" or key == "req" or methods[key] then
        raise("ws." .. tostring(key) .. " cannot be set")
    end
    local f = fields_of[ws]
    if not f then
        f = {}
        fields_of[ws] = f
    end
    f[key] = value
end
ws_mt.__tostring = function(ws) return "websocket " .. tostring(ws.id) end

-- the state bits, read in place (the FFI casts a userdata to its payload's address): checked
-- several times per message, where a C call would cost more than the rest of the check
local u8p, FLAGS_AT = ffi.typeof("const uint8_t *"), core.ws_flags_at()
local function flags(ws)
    return cast(u8p, ws)[FLAGS_AT]
end

local function done(ws)
    return band(flags(ws), DONE) ~= 0
end

local ended

-- Writes frame bytes on the socket's stream (s, g: from ws_st, taken by the caller with the
-- state it checked). own: the caller is one of this socket's handlers (it may wait for the
-- queue to drain); anyone else never waits, and past stream_out_cap the socket is closed 1008.
local function put(ws, s, g, bytes, own)
    local ok, err = write(s, g, bytes, own and "wait" or "push")
    if ok == true then return true end
    if err == "full" then
        -- the slow consumer: say why, then end it (the close frame may never be read)
        -- (in "wait" mode: past the cap "push" would refuse it; a sender that is not the
        -- socket's own handler never waits)
        local cf = ws_close(ws, 1008, "slow consumer")
        if cf then write(s, g, cf, "wait") end
        ws_code(ws, 1008)
        finish(s, g, true) -- cut: h2 resets the stream, dropping what is queued
        ws_flag(ws, DONE)
        -- the close handler runs later, in a callback of its own: not inside this send (a
        -- k.publish walking its subscribers, another socket's handler)
        core.timer(0, nil, function() ended(ws) end)
        return nil, "closed"
    end
    return nil, err or "closed"
end

-- the message handler's coroutine -> its socket, while it runs
local handler_of = setmetatable({}, weak)

local function own(ws)
    local co = co_running()
    return co ~= nil and (co == reader_of[ws] or handler_of[co] == ws)
end

-- ws:send(data[, binary]) -> true | nil, "closed"
function methods.send(ws, data, binary)
    if type(ws) ~= "userdata" then
        raise("ws:send(data[, binary]): call it with ':'")
    end
    local t = type(data)
    if t == "number" then
        data = tostring(data)
    elseif t ~= "string" then
        raise("ws:send(data[, binary]): data must be a string, got a " .. t)
    end
    local s, g, f = ws_st(ws)
    if band(f, CLOSING + DONE) ~= 0 then return nil, "closed" end
    return put(ws, s, g, ws_frame(ws, binary and OP_BINARY or OP_TEXT, data), own(ws))
end

-- ws:ping([data]) -> true | nil, "closed" (the codec answers the peer's pings by itself)
function methods.ping(ws, data)
    data = data or ""
    if type(data) ~= "string" or #data > 125 then
        raise("ws:ping([data]): data is a string of at most 125 bytes")
    end
    local s, g, f = ws_st(ws)
    if band(f, CLOSING + DONE) ~= 0 then return nil, "closed" end
    return put(ws, s, g, ws_frame(ws, OP_PING, data), own(ws))
end

-- ws:close([code[, reason]]): starts the close handshake; the close callback runs once the
-- peer answered (or after ws_close_timeout_ms).
function methods.close(ws, code, reason)
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
    local s, g, f = ws_st(ws)
    if band(f, CLOSING + DONE) ~= 0 then return true end
    ws_flag(ws, CLOSING)
    local cf = ws_close(ws, code, reason)
    if cf then write(s, g, cf, "wait") end
    core.timer(core.ws_limits().close_timeout, nil, function()
        if not done(ws) then
            if ws_code(ws) == 0 then ws_code(ws, 1006) end
            ws_flag(ws, DONE)
            local s2, g2 = ws_st(ws) -- its stream now: it may have moved (compact, below)
            finish(s2, g2)
            ended(ws)
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

function methods.subscribe(ws, topic)
    if type(topic) ~= "string" then raise("ws:subscribe(topic): topic must be a string") end
    local set = topics[topic]
    if not set then
        set = setmetatable({}, weak)
        topics[topic] = set
        require("khamsin").subscribe(topic, topic_fn(topic))
    end
    set[ws] = true
    local mine = topics_of[ws]
    if not mine then
        mine = {}
        topics_of[ws] = mine
    end
    mine[topic] = true
end

function methods.unsubscribe(ws, topic)
    local set = topics[topic]
    if set then set[ws] = nil end
    local mine = topics_of[ws]
    if mine then mine[topic] = nil end
end

-- push target (khamsin.push): never yields
function methods._push(ws, data)
    if type(data) ~= "string" then data = tostring(data) end
    local s, g, f = ws_st(ws)
    if band(f, CLOSING + DONE) ~= 0 then return nil, "closed" end
    return put(ws, s, g, ws_frame(ws, OP_TEXT, data), false)
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
function ended(ws)
    local s, g, f = ws_st(ws)
    if band(f, ENDED) ~= 0 then return end
    if reader_of[ws] then ws_flag(ws, PENDING) return end
    ws_flag(ws, ENDED + DONE)
    if ws_code(ws) == 0 then ws_code(ws, 1006) end -- no close frame
    finish(s, g)
    push.unregister(ws_pn(ws))
    local mine = topics_of[ws]
    if mine then for t in pairs(mine) do methods.unsubscribe(ws, t) end end
    -- the engine's hold (core.defer_hold); the abort event has taken it out of held already.
    -- defer_release checks the generation and that a hold is there: safe when there was none
    if held[s] == ws then held[s] = nil end
    core.defer_release(s, g)
    local h = ws_env(ws).h
    if h.close then call(ws, h.close, ws_code(ws)) end
end

-- A held HTTP/1.1 tunnel moves into a compact stream (core.stream_compact, kh_stream_compact:
-- what a tunnel needs, without the request's part): from a timer callback, where no C frame
-- holds the old pointer (h1's dispatch does while the handshake's handler runs), and only while
-- no reader runs (else again once the reader ends). The hold registry (held) follows it in C,
-- the ws object here. HTTP/2 and HTTP/3 streams never move.
local function compact(ws)
    local s, g, f = ws_st(ws)
    if band(f, DONE + CLOSING + COMPACT) ~= 0 then return end
    local s2, g2 = stream_compact(s, g)
    if s2 == false then return end -- a reader runs: it tries again as it ends
    ws_flag(ws, COMPACT)
    if s2 and s2 ~= true then ws_move(ws, s2, g2) end
end

-- Reads what the tunnel has now (never waits for input): each chunk to the codec, each message
-- to the message handler, in order. Runs in a coroutine that owns the stream (the request's
-- own right after the handshake, then one started by each arrival: the "tunnel" event).
local function drain(ws)
    local s, g = ws_st(ws)
    local message, queue = ws_env(ws).h.message, QUEUE
    local list = remove(spare_lists) or {} -- (garbage per wake-up: RSS after a burst)
    reader_of[ws] = co_running()
    while not done(ws) do
        local chunk, err = body_chunk(s, g, true)
        if chunk == true then goto continue end -- woken: ask again
        if type(chunk) ~= "string" then
            if err ~= "wait" then ws_flag(ws, DONE) end -- the end of input, or the peer left
            break
        end
        do
            local pos = 1
            while true do
                local st, used, _, code = ws_feed(ws, pos == 1 and chunk or sub(chunk, pos), list, queue)
                for i = 1, #list, 2 do
                    local data, tag = list[i], list[i + 1]
                    list[i], list[i + 1] = nil, nil
                    if tag == 0 then -- a pong or close frame of the codec's, in order
                        if not done(ws) then write(s, g, data, "push") end
                    elseif message and not done(ws) then
                        run_message(ws, message, data, tag)
                    end
                end
                if st == "closed" then
                    ws_code(ws, code)
                    ws_flag(ws, DONE)
                    break
                end
                if st == "ok" then break end
                pos = pos + used
            end
        end
        ::continue::
    end
    reader_of[ws] = nil
    if list[1] == nil then spare_lists[#spare_lists + 1] = list end
    local f = flags(ws)
    if band(f, DONE + PENDING) ~= 0 then
        ended(ws)
    elseif band(f, COMPACT + CLOSING) == 0 then
        core.timer(0, nil, function() compact(ws) end)
    end
end

-- held-stream hooks (khamsin.stream.held; khamsin.lua's "tunnel" and "abort" events)
function methods._readable(ws, g)
    local _, mine = ws_st(ws)
    if g == mine then drain(ws) end
end

function methods._aborted(ws)
    ws_flag(ws, DONE)
    ended(ws)
end

-- request headers one by one (core.header): no req.headers table is built, so what an idle
-- socket keeps of its request is only what open() read (README "WebSocket")
local function hdr(req, s, g, name)
    if rawget(req, "headers") then return header(req, name) end
    return core_header(s, g, name)
end

local LIMITS

local function serve(route, req, res)
    local limits = LIMITS
    if not limits then
        limits = core.ws_limits()
        LIMITS, QUEUE = limits, limits.queue
    end
    local h, opts = route.h, route.opts
    local s, g = res._s, res._g
    -- no FFI accessor here (lua/khamsin/request.lua): it reads the stream each time and keeps
    -- nothing, while a socket's req must keep what open() read once the head's memory is gone
    rawset(req, "_p", false)
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
    local proto = 0
    if opts.protocols then
        local offered = hdr(req, s, g, "sec-websocket-protocol")
        if offered then
            for p in gmatch(offered, "[^,%s]+") do
                for i, mine in ipairs(opts.protocols) do
                    if p == mine and proto == 0 then
                        out["Sec-WebSocket-Protocol"], proto = p, i
                    end
                end
            end
        end
    end
    local ok, err = core.respond(s, g, 200, nil, out, nil, "tunnel") -- 101 on h1, 200 on h2
    if ok == false then raise(err) end
    rawset(res, "_deferred", true) -- the handler answered (101 / 200): nothing more to send
    if not ok then return end

    local ws = ws_codec(bits, s, g, route, proto) -- (its limits: the worker's, in C)
    local _, n = push.register(ws)
    ws_pn(ws, n)
    req_of[ws] = req
    reader_of[ws] = co_running() -- open() is one of its own handlers
    if h.open then call(ws, h.open, req) end
    reader_of[ws] = nil
    -- req is for open(): kept only when something read from it (fields beyond its _s, _g, _p)
    if req_of[ws] == req then
        local key = next(req)
        while key == "_s" or key == "_g" or key == "_p" do key = next(req, key) end
        if key == nil then req_of[ws] = nil end
    end
    -- between messages no coroutine waits for the socket: the engine holds the stream
    -- (defer_hold) and starts a reader for each arrival (KH_WAIT_TUNNEL, lua/kh_lua_sched.c);
    -- the request head's arena is given back (stream_hold): what open() read of req stays in
    -- the req table, the rest reads as empty afterwards
    -- On HTTP/1.1 the stream then moves into a compact one (compact, below).
    if not done(ws) and core.defer_hold(s, g) then
        held[s] = ws
        core.stream_hold(s, g)
    else
        ws_flag(ws, DONE)
    end
    drain(ws) -- what came with or right after the handshake
    -- One step of the Lua GC per handshake (at most one incremental step's work; in the GC's
    -- pause it starts the next cycle early): a handshake leaves its request's garbage (req, res,
    -- the request's coroutine, header strings), and with the default pause (200) a burst of
    -- handshakes lets the Lua heap grow to twice what the sockets keep before a cycle frees it;
    -- the allocator keeps those pages resident. With the step, VmRSS per idle socket at 10,000
    -- sockets went from ~1,150 to ~1,040 B (bench/README.md). Handshakes only: the message path
    -- keeps the pause it has.
    collectgarbage("step", 0)
end

M._ended = function(ws) return ended(ws) end

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
    -- the route's table: every socket of the route has it as its environment (core.ws_env)
    local route = { h = h, opts = { origin = o, protocols = h.protocols } }
    add("k.websocket", "@websocket", path, function(req, res) return serve(route, req, res) end)
end

return M
