-- khamsin.defer: deferred replies (res:defer()). The handler returns; the stream stays open,
-- held by the engine (core.defer_hold), until d:send(), a timeout (504) or the client leaving.
-- Owns: this worker's registry of pending deferred replies, by id and by stream.
-- Ids are "<worker>:<generation>:<n>", so k.resolve(id, ...) on any worker finds the owner: the
-- worker, and the app instance on it (after a reload, kh_app.h, a deferred reply started before
-- it lives in the old instance until answered). Another worker's or another instance's ids go
-- through that worker's mailbox, with the generation. The timeout timer is the engine's own
-- (core.timer's 4th argument): a reload does not stop it.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local setmetatable, getmetatable, error, pcall, tostring, tonumber, type =
    setmetatable, getmetatable, error, pcall, tostring, tonumber, type

local M = {}

local by_id, by_stream = {}, {}
local seq = 0
local finish -- response.finish, set by khamsin.response (no require cycle)

function M.set_finish(fn) finish = fn end

local D = {}
D.__index = D

local function unregister(d)
    by_id[d.id] = nil
    if by_stream[d._s] == d then by_stream[d._s] = nil end
    if d._timer then d._timer:cancel(); d._timer = nil end
end

local function release(d)
    core.defer_release(d._s, d._g)
end

-- Answers the deferred request. A second send raises; after a timeout or the client leaving it
-- returns nil, "timeout" | "closed".
function D:send(status, body, headers)
    if getmetatable(self) ~= D then raise("d:send() is a method: call it with a colon") end
    if self._state == "sent" then
        raise("deferred reply " .. self.id .. " was already sent")
    elseif self._state then
        return nil, self._state
    end
    self._state = "sent"
    unregister(self)
    local ok, err = pcall(finish, self._res, status, body, headers, "d:send got")
    release(self) -- a send that failed answers 500 (core.defer_release)
    if not ok then error(err, 0) end -- err names the app's line already (errors.raise)
    return true
end

-- fn() runs (in a coroutine of its own) when the client leaves before the reply is sent.
function D:on_abort(fn)
    if getmetatable(self) ~= D then raise("d:on_abort(fn) is a method: call it with a colon") end
    if type(fn) ~= "function" then raise("d:on_abort(fn): fn must be a function, got a " .. type(fn)) end
    if self._state == "closed" then
        fn()
        return
    end
    self._aborts[#self._aborts + 1] = fn
end

function D:pending()
    if getmetatable(self) ~= D then raise("d:pending() is a method: call it with a colon") end
    return self._state == nil
end

function M.new(res, opts)
    if rawget(res, "_deferred") then raise("res:defer() was already called for this request") end
    local timeout = opts and opts.timeout
    if timeout ~= nil and (type(timeout) ~= "number" or not (timeout > 0 and timeout <= 1e9)) then
        raise("res:defer{timeout = seconds}: seconds must be a number above 0 (up to 1e9)")
    end
    local ok, err = core.defer_hold(res._s, res._g)
    if not ok then error(errors.aborted(err), 0) end
    seq = seq + 1
    local d = setmetatable({
        id = core.worker_id() .. ":" .. core.gen() .. ":" .. seq, _s = res._s, _g = res._g, _res = res, _aborts = {},
    }, D)
    rawset(res, "_deferred", d)
    by_id[d.id] = d
    by_stream[d._s] = d
    d._timer = core.timer(timeout or core.defer_timeout(), nil, function()
        if d._state then return end
        d._timer = nil
        d._state = "timeout"
        unregister(d)
        pcall(finish, d._res, 504, "Gateway Timeout\n")
        release(d)
    end, true)
    return d
end

-- The handler raised after res:defer(): the runner answers 500, so the defer is dropped.
function M.drop(res)
    local d = rawget(res, "_deferred")
    if d and not d._state then
        d._state = "dropped"
        unregister(d)
        release(d)
    end
end

-- The engine saw the client leave (an "abort" event, in a coroutine of its own).
function M.on_abort(s)
    local d = by_stream[s]
    if not d or d._state then return end
    d._state = "closed"
    unregister(d)
    release(d)
    local fns = d._aborts
    d._aborts = {}
    for i = 1, #fns do
        local ok, e = pcall(fns[i])
        if not ok and not errors.is_aborted(e) then
            core.log(0, "deferred reply " .. d.id .. ": on_abort callback failed: " .. tostring(e))
        end
    end
end

-- k.resolve(id, status, body, headers): answers a deferred reply on any worker.
function M.resolve(id, status, body, headers)
    if type(id) ~= "string" then
        raise("k.resolve(id, ...): id must be a deferred reply's d.id, got a " .. type(id))
    end
    local w, g = id:match("^(%d+):(%d+):%d+$")
    w, g = tonumber(w), tonumber(g)
    if not w then raise("k.resolve: '" .. id .. "' is not a deferred reply id") end
    if w ~= core.worker_id() or g ~= core.gen() then
        local ok, err = core.post_resolve(w, g, id, status, body, headers)
        if ok == false then raise(err) end -- a value that cannot be copied
        return ok, err
    end
    local d = by_id[id]
    if not d then return nil, "unknown or already answered" end
    return d:send(status, body, headers)
end

-- A resolve posted by another worker.
function M.on_resolve(id, status, body, headers)
    local d = by_id[id]
    if not d then
        core.log(3, "k.resolve: deferred reply " .. tostring(id) .. " is gone (answered, timed out or aborted)")
        return
    end
    local ok, e = pcall(d.send, d, status, body, headers)
    if not ok then core.log(0, "k.resolve " .. tostring(id) .. ": " .. tostring(e)) end
end

function M.count()
    local n = 0
    for _ in pairs(by_id) do n = n + 1 end
    return n
end

return M
