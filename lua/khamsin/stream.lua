-- khamsin.stream: streamed replies (res:write, res:finish), the incremental request body
-- (req:body_reader) and the bookkeeping of streams kept open after their handler (SSE held by
-- `return sse`). Loaded on first use. Knows no wire format: chunked (h1) or DATA (h2) framing is
-- the protocol's (core/kh_stream.h, "the seam").
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, rawget, rawset, tostring, error = type, rawget, rawset, tostring, error
local respond, write, finish_ = core.respond, core.stream_write, core.stream_finish
local body_chunk = core.body_chunk

local M = {}

local TEXT = "text/plain; charset=utf-8"

local function valid_status(st)
    return type(st) == "number" and st % 1 == 0 and st >= 200 and st <= 999
end

-- Sends the head once (res.status, res.headers, no length: chunked on h1, DATA on h2).
-- Returns true, or nil, "closed".
function M.start(res, ctype, who, headers)
    if rawget(res, "_streaming") then return true end
    local status = rawget(res, "status") or 200
    if not valid_status(status) then
        raise((who or "res:write") .. ": res.status is " .. tostring(status) .. ": a status is an "
            .. "integer from 200 to 999")
    end
    if status == 204 or status == 304 then
        raise((who or "res:write") .. ": a " .. status .. " response has no body (RFC 9110)")
    end
    local h = headers or rawget(res, "headers")
    if h ~= nil and type(h) ~= "table" then raise("res.headers is not a table") end
    local ok, err = respond(res._s, res._g, status, nil, h, ctype or TEXT, "stream")
    if ok == false then raise(err) end
    rawset(res, "_streaming", true)
    if ok == nil then return nil, err end
    return true
end

-- res:write(chunk): waits while the stream has stream_high_water bytes queued; nil, "closed"
-- once the client is gone.
function M.write(res, chunk)
    local t = type(chunk)
    if t == "number" then
        chunk = tostring(chunk)
    elseif t ~= "string" then
        raise("res:write(chunk): chunk must be a string, got a " .. t)
    end
    if rawget(res, "_finished") then return nil, "closed" end -- after res:finish()
    if not rawget(res, "_streaming") then
        local ok, err = M.start(res)
        if not ok then return nil, err end
    end
    if chunk == "" then return true end
    local ok, err = write(res._s, res._g, chunk, "wait")
    if ok == true then return true end
    return nil, err or "closed"
end

-- res:finish(): ends the streamed response now (the handler may go on with other work).
function M.finish(res)
    if rawget(res, "_finished") then return true end
    if not rawget(res, "_streaming") then
        local ok, err = M.start(res)
        if not ok then rawset(res, "_finished", true) return nil, err end
    end
    rawset(res, "_finished", true)
    local ok, err = finish_(res._s, res._g)
    if ok then return true end
    return nil, err
end

-- Streams kept open after their handler (an SSE stream the handler returned, a WebSocket):
-- stream pointer -> object with :_aborted(); the abort event (core: the peer left) reaches
-- them here. It is the engine's own table of held streams (core.held: every core.defer_hold
-- puts `true` there, which the object replaces with itself), so a held stream costs one entry.
local held = core.held()
M.held = held

-- The handler returned (response.finish) after res:write / res:sse.
function M.ended(res, a, b, c, who)
    if type(a) == "table" and rawget(a, "_s") == res._s and type(a._keep) == "function" and b == nil then
        return a:_keep() -- `return sse`: the stream stays open, idle, after the handler
    end
    local sse = rawget(res, "_sse")
    if sse then sse:_ended() end
    if a ~= nil or b ~= nil or c ~= nil then
        M.finish(res)
        raise((who or "the handler returned") .. " values after res:write/res:sse started the "
            .. "response: return nothing (or the SSE stream to keep it open)")
    end
    M.finish(res)
end

-- The abort event of a held stream (the client left): true when it was one of ours.
function M.on_abort(s)
    local obj = held[s]
    if not obj or obj == true then return false end -- (true: a deferred reply's hold)
    obj:_aborted() -- finds itself in held: drops its entry and the hold (core.defer_release),
    held[s] = nil  -- so the stream, and the app instance it names, are freed
    return true
end

-- req:body_reader(): an iterator of body chunks, waiting for each under body_window; nil at
-- the end. Raises the abort error when the client leaves before the end.
function M.body_reader(req)
    local s, g = rawget(req, "_s"), rawget(req, "_g")
    local done = false
    return function()
        if done then return nil end
        while true do
            local chunk, err = body_chunk(s, g)
            if type(chunk) == "string" then return chunk end
            if chunk == false then
                if err then raise(err) end
                done = true
                return nil
            end
            if chunk ~= true then
                done = true
                if err == "too large" then error(errors.http(413, "Request body too large"), 0) end
                error(errors.aborted(err or "closed"), 0)
            end
        end
    end
end

return M
