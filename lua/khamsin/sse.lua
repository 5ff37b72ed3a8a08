-- khamsin.sse: Server-Sent Events (text/event-stream, WHATWG HTML §9.2) on a streamed response.
-- res:sse() sends the head and returns a stream with :send{event=, data=, id=, retry=},
-- :comment(text), :close(), :on_close(fn) and .id (for k.send_to). In the handler's own
-- coroutine :send waits while the stream is above stream_high_water; from anywhere else (a
-- timer, a subscriber, k.send_to) it never waits, and a stream past stream_out_cap is ended
-- (slow consumer), never buffered without bound. A keep-alive comment goes out on every stream
-- idle for sse_keepalive_ms (one timer per worker, not one per stream). The handler may
-- `return sse` to keep the stream open, idle, after it returns (its request head's memory is
-- given back); the stream then ends on :close(), a slow consumer, or the client leaving.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
local stream = require "khamsin.stream"
local push = require "khamsin.push"
errors.own()
local raise = errors.raise

local type, tostring, rawget, setmetatable, pairs, pcall = type, tostring, rawget,
    setmetatable, pairs, pcall
local find, gsub, gmatch, concat, floor = string.find, string.gsub, string.gmatch, table.concat,
    math.floor
local write, finish_, queued = core.stream_write, core.stream_finish, core.stream_queued
local running, now = coroutine.running, core.now

local M = {}

local S = {}
local S_mt = { __index = S }

local open = {} -- every open SSE stream of this worker (the keep-alive timer walks it)
-- the handler's coroutine of each stream, while it runs (weak: an idle held stream keeps none;
-- the stream objects stay small, for memory per idle stream, README "Streams")
local owner_co = setmetatable({}, { __mode = "k" })
local ticker

local _, keepalive_ms = core.stream_limits()

local function close_stream(self, why)
    if self._closed then return end
    self._closed = why or "closed"
    open[self] = nil
    push.unregister(self.id)
    -- the engine's hold of a kept stream (`return sse`): the abort event (the client left)
    -- takes it out of stream.held before this runs, so the hold is released whether or not it
    -- is still there (defer_release checks the generation and that a hold is there)
    if stream.held[self._s] == self then stream.held[self._s] = nil end
    core.defer_release(self._s, self._g)
    local fns = self._on_close
    if fns then
        for i = 1, #fns do
            local ok, e = pcall(fns[i], self, self._closed)
            if not ok then core.log(0, "sse on_close callback failed: " .. tostring(e)) end
        end
    end
end

-- Writes one encoded piece. In the handler's own coroutine: may wait for drain. Elsewhere:
-- never waits; past stream_out_cap the stream is ended.
local function put(self, payload)
    if self._closed then return nil, "closed" end
    local co = owner_co[self]
    local own = co ~= nil and running() == co
    local ok, err = write(self._s, self._g, payload, own and "wait" or "push")
    if ok == true then
        self._last = now()
        return true
    end
    if err == "full" then
        core.log(1, "sse stream " .. self.id .. ": over stream_out_cap queued: ended (slow consumer)")
        finish_(self._s, self._g, true) -- cut: h2 resets the stream, dropping what is queued
        close_stream(self, "slow consumer")
        return nil, "closed"
    end
    close_stream(self, "closed")
    return nil, "closed"
end

local function check_field(what, v)
    if type(v) == "number" then v = tostring(v) end
    if type(v) ~= "string" then
        raise("sse:send: " .. what .. " must be a string, got a " .. type(v))
    end
    if find(v, "[\r\n]") then
        raise("sse:send: " .. what .. " has a CR or LF, which would end the field (" .. what
            .. " is one line)")
    end
    if what == "id" and find(v, "\0", 1, true) then
        raise("sse:send: id has a NUL, which the client would ignore the id for")
    end
    return v
end

-- One event: `event:`, `id:`, `retry:`, then each line of data as its own `data:` line.
local function encode(ev)
    local out, n = {}, 0
    if type(ev) == "string" or type(ev) == "number" then ev = { data = ev } end
    if type(ev) ~= "table" then
        raise("sse:send(event): event must be a table {event=, data=, id=, retry=} or a string, got a "
            .. type(ev))
    end
    if ev.event ~= nil then
        n = n + 1; out[n] = "event: " .. check_field("event", ev.event) .. "\n"
    end
    if ev.id ~= nil then
        n = n + 1; out[n] = "id: " .. check_field("id", ev.id) .. "\n"
    end
    if ev.retry ~= nil then
        local r = ev.retry
        if type(r) ~= "number" or r < 0 or r % 1 ~= 0 then
            raise("sse:send: retry must be a whole number of milliseconds, got " .. tostring(r))
        end
        n = n + 1; out[n] = "retry: " .. floor(r) .. "\n"
    end
    local data = ev.data
    if data ~= nil then
        if type(data) == "table" then
            local j, msg = core.json_encode(data)
            if not j then raise("sse:send: data is a table that cannot be sent as JSON: " .. msg) end
            data = j
        elseif type(data) ~= "string" then
            data = tostring(data)
        end
        -- CRLF, CR and LF all end a line (WHATWG §9.2.6): each line is a data: line
        data = gsub(data, "\r\n", "\n")
        data = gsub(data, "\r", "\n")
        for line in gmatch(data .. "\n", "([^\n]*)\n") do
            n = n + 1; out[n] = "data: " .. line .. "\n"
        end
    end
    if n == 0 then raise("sse:send: the event is empty (give data, event, id or retry)") end
    n = n + 1; out[n] = "\n"
    return concat(out)
end

function S:send(ev)
    if getmetatable(self) ~= S_mt then raise("sse:send(event) is a method: call it with a colon") end
    return put(self, encode(ev))
end

function S:comment(text)
    if getmetatable(self) ~= S_mt then raise("sse:comment(text) is a method: call it with a colon") end
    text = text == nil and "" or tostring(text)
    text = gsub(gsub(text, "\r\n", "\n"), "\r", "\n")
    local out = {}
    for line in gmatch(text .. "\n", "([^\n]*)\n") do out[#out + 1] = ": " .. line .. "\n" end
    out[#out + 1] = "\n"
    return put(self, concat(out))
end

-- Ends the stream (the client sees the response end; EventSource reconnects unless told by a
-- 204 or another status on its next request).
function S:close()
    if getmetatable(self) ~= S_mt then raise("sse:close() is a method: call it with a colon") end
    if self._closed then return end
    finish_(self._s, self._g)
    close_stream(self, "closed by the server")
end

-- fn(sse, why) runs once when the stream ends (the client left, :close(), slow consumer).
function S:on_close(fn)
    if type(fn) ~= "function" then raise("sse:on_close(fn): fn must be a function, got a " .. type(fn)) end
    local l = self._on_close
    if not l then l = {}; self._on_close = l end
    l[#l + 1] = fn
end

-- k.send_to(sse.id, data): data is an event table or the data string.
function S:_push(data)
    return self:send(data)
end

-- `return sse` from the handler: keep the stream open, idle, without its coroutine.
function S:_keep()
    if self._closed then return end
    local ok = core.defer_hold(self._s, self._g)
    if not ok then close_stream(self, "closed") return end
    owner_co[self] = nil
    stream.held[self._s] = self
    core.stream_hold(self._s, self._g) -- the request head's memory goes back
end

-- The handler ended without keeping the stream (it returned, or raised): the response is over.
function S:_ended()
    close_stream(self, "ended")
end

function S:_aborted()
    close_stream(self, "client left")
end

local function tick()
    local t = now()
    local idle = keepalive_ms / 1000
    for s in pairs(open) do
        local _, is_open = queued(s._s, s._g)
        if not is_open then
            close_stream(s, "client left")
        elseif t - s._last >= idle * 0.95 then
            s:comment("")
        end
    end
end

-- nginx in front: X-Accel-Buffering: no (do not buffer the stream)
local SSE_HEADERS = { ["Cache-Control"] = "no-cache", ["X-Accel-Buffering"] = "no" }

function M.open(res)
    if rawget(res, "_streaming") then raise("res:sse(): the response has started already") end
    local h = rawget(res, "headers")
    if h == nil then
        h = SSE_HEADERS -- shared, read-only: no table per stream
    else
        if h["Cache-Control"] == nil then h["Cache-Control"] = "no-cache" end
        if h["X-Accel-Buffering"] == nil then h["X-Accel-Buffering"] = "no" end
    end
    local ok, err = stream.start(res, "text/event-stream; charset=utf-8", "res:sse()", h)
    local self = setmetatable({ _s = res._s, _g = res._g, _last = now() }, S_mt)
    owner_co[self] = running()
    rawset(res, "_sse", self)
    self.id = push.register(self)
    local lei = core.header(res._s, res._g, "last-event-id") -- the client's (README)
    if lei then self.last_event_id = lei end
    if not ok then close_stream(self, err) return self end
    open[self] = true
    if keepalive_ms > 0 and not ticker then
        -- one timer per worker for every stream's keep-alive (a uv timer per stream would
        -- cost more than the idle stream itself); the engine's own (internal): it goes on
        -- after a hot reload retired this instance, which serves its streams until they end
        -- (a client that left is found by the next keep-alive write)
        ticker = core.timer(keepalive_ms / 4000, keepalive_ms / 4000, tick, true)
    end
    return self
end

function M.count()
    local n = 0
    for _ in pairs(open) do n = n + 1 end
    return n
end

return M
