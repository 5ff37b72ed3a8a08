-- khamsin.middleware: k.use (middleware), k.on_error (error handlers) and the chain a request
-- runs through when the app has either.
-- Owns: the middleware list and the error handlers (declared while the script loads), the chain
-- (middleware in declaration order, then the handler), the engine's own 404/405 for unmatched
-- requests (which the engine hands to the app only when this module is active: core.fallback),
-- and the turning of an error (404/405, k.fail, a Lua error, busy) into an error handler's reply
-- or the plain page.
-- An app with neither k.use nor k.on_error never loads this module: requests take khamsin.lua's
-- direct path and unmatched ones are answered in C (kh_stream_on_head).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
local response = require "khamsin.response"
errors.own()

local type, select, xpcall, tostring, traceback = type, select, xpcall, tostring, debug.traceback
local sub = string.sub
local raise, is_http, is_aborted, is_busy = errors.raise, errors.is_http, errors.is_aborted,
    errors.is_busy

local M = {}

local list = {}      -- { prefix = "/api" | false, fn = function(req, res, next) }
local handlers = {}  -- status | "*" -> function(req, res, err)
local activated = false

-- Marks the engine's own error reply as it travels back through next(): a middleware sees
-- `404, <marker>` (res.status is set too) and may pass it on or answer something else.
local ENGINE = setmetatable({}, { __tostring = function() return "(the engine's error reply)" end })
M.ENGINE = ENGINE

local function check_loading(what)
    if not core.loading() then
        raise(what .. ": declared while the script loads (every worker loads it)")
    end
end

-- The final handler of unmatched requests: the engine's 404, or 405 with Allow.
local function unmatched(req, res)
    local _, st, allow = core.route_of(req._s, req._g)
    st = st or 404
    if st == 405 and allow then res.headers["Allow"] = allow end
    res.status = st
    return st, ENGINE
end

local function activate()
    if activated then return end
    activated = true
    core.fallback(unmatched)
end


-- "/api", "/api/" -> "/api"; "/" -> false (every path)
local function norm_prefix(what, p)
    if type(p) ~= "string" or sub(p, 1, 1) ~= "/" then
        raise(what .. ": the prefix must be a path starting with '/', got "
            .. response.describe(p))
    end
    if p:find("[?#]") then raise(what .. ": the prefix '" .. p .. "' has a '?' or '#'") end
    p = p:gsub("/+$", "")
    if p == "" then return false end
    return p
end

function M.use(a, b)
    check_loading("k.use")
    local prefix, fn = false, a
    if b ~= nil or type(a) == "string" then prefix, fn = norm_prefix("k.use(prefix, fn)", a), b end
    if type(fn) ~= "function" then
        raise("k.use([prefix,] fn): fn must be a function(req, res, next), got a " .. type(fn))
    end
    list[#list + 1] = { prefix = prefix, fn = fn }
    activate()
end

function M.on_error(status, fn)
    check_loading("k.on_error")
    if status ~= "*" and (type(status) ~= "number" or status % 1 ~= 0 or status < 400
            or status > 599) then
        raise("k.on_error(status, fn): status must be an integer from 400 to 599 or \"*\", got "
            .. response.describe(status))
    end
    if type(fn) ~= "function" then
        raise("k.on_error(status, fn): fn must be a function(req, res, err), got a " .. type(fn))
    end
    handlers[status] = fn
    activate()
end

-- "/api" covers "/api" and "/api/..." (segment boundary: not "/apix")
local function covers(prefix, path)
    if not prefix then return true end
    local n = #prefix
    if sub(path, 1, n) ~= prefix then return false end
    local c = sub(path, n + 1, n + 1)
    return c == "" or c == "/"
end

-- Runs middleware i.. then the handler; each middleware gets its own next (callable once).
local function step(i, handler, req, res, path)
    for j = i, #list do
        local m = list[j]
        if covers(m.prefix, path) then
            local used = false
            return m.fn(req, res, function()
                if used then raise("next() was called twice by one middleware") end
                used = true
                return step(j + 1, handler, req, res, path)
            end)
        end
    end
    return handler(req, res)
end

-- The chain; answer(res, n, ...) is khamsin.lua's (it turns return values into the reply).
function M.chain(handler, req, res)
    return step(1, handler, req, res, req.path)
end

local function on_xerror(e)
    if is_http(e) or is_aborted(e) or is_busy(e) then return e end
    local mt = type(e) == "table" and getmetatable(e)
    local msg = (type(e) == "string" or (mt and mt.__tostring)) and tostring(e)
        or ("(error object is a " .. type(e) .. " value: " .. tostring(e) .. ")")
    return { traceback = traceback(msg, 2) }
end
M.on_xerror = on_xerror

local function counted(...) return select("#", ...), ... end

-- The request failed with e (an xpcall result of the chain, or the engine's own 404/405 as
-- errors.http): the error handler for its status (else "*") answers; without one, or when it
-- fails too, the plain page does (response.fail). finish is response.finish.
function M.fail(req, res, e, answer)
    if is_aborted(e) then return response.fail(req, res, e) end
    local status = is_http(e) and e.status or (is_busy(e) and 503) or 500
    local h = handlers[status] or handlers["*"]
    if status == 500 then
        response.log_error(req, e) -- the bug is logged whether or not a handler answers
    end
    if h and not rawget(res, "_deferred") then
        local err = { status = status }
        if is_http(e) then err.message = e.message
        elseif is_busy(e) then err.message = tostring(e.reason)
        else err.traceback = type(e) == "table" and e.traceback or tostring(e) end
        res.status = status
        local ok, e2 = xpcall(function() answer(res, counted(h(req, res, err))) end, on_xerror)
        if ok then return end
        if is_aborted(e2) then return end
        core.log(0, "error handler for " .. status .. " failed: "
            .. tostring(type(e2) == "table" and (e2.traceback or tostring(e2)) or e2))
    end
    response.fail(req, res, e, true)
end

return M
