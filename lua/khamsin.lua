-- khamsin: the public module. Loaded once in every worker's own Lua state.
-- Owns: route registration and the request runner (_run), which turns a handler's return values
-- into a response. Knows nothing of wire formats: everything goes through khamsin.core.
local core = require "khamsin.core"
local request = require "khamsin.request"
local response = require "khamsin.response"

local type, error, tostring, select = type, error, tostring, select
local xpcall, traceback = xpcall, debug.traceback
local concat = table.concat

local k = {}

-- An error raised with k.fail(status, message) (or by req:json()) is a client-visible answer,
-- not a bug: it is not logged as [error].
local http_error_mt = { __tostring = function(e) return e.status .. " " .. tostring(e.message) end }

function k.fail(status, message)
    error(setmetatable({ status = status, message = message }, http_error_mt), 2)
end

local function is_http_error(e)
    return type(e) == "table" and getmetatable(e) == http_error_mt
end
k._is_http_error = is_http_error

local function add(method, path, fn, level)
    if type(path) ~= "string" then error("route path must be a string", level) end
    if type(fn) ~= "function" then error("route handler must be a function", level) end
    local ok, err = core.route(method, path, fn)
    if not ok then error(err, level) end
end

for _, m in ipairs { "get", "post", "put", "patch", "delete", "options" } do
    local method = m:upper()
    k[m] = function(path, fn) add(method, path, fn, 3) end
end

function k.any(path, fn) add("*", path, fn, 3) end

function k.route(method, path, fn)
    if type(method) ~= "string" then error("route method must be a string", 2) end
    add(method, path, fn, 3)
end

function k.worker_id() return core.worker_id() end
function k.workers() return core.workers() end
function k.now() return core.now() end

local function log_args(...)
    local n = select("#", ...)
    local t = {}
    for i = 1, n do t[i] = tostring((select(i, ...))) end
    return concat(t, " ")
end

k.log = {
    err = function(...) core.log(0, log_args(...)) end,
    warn = function(...) core.log(1, log_args(...)) end,
    info = function(...) core.log(2, log_args(...)) end,
    debug = function(...) core.log(3, log_args(...)) end,
}

-- The request runner: dispatch resumes a coroutine on run(handler, stream, gen).
local function on_error(e)
    if is_http_error(e) then return e end
    local msg = type(e) == "string" and e or ("(error object is a " .. type(e) .. " value: "
        .. tostring(e) .. ")")
    return { traceback = traceback(msg, 2) }
end

local new_req, new_res, finish = request.new, response.new, response.finish

function k._run(handler, s, gen)
    local req, res = new_req(s, gen), new_res(s, gen)
    local ok, a, b, c = xpcall(handler, on_error, req, res)
    if ok then
        ok, a = xpcall(finish, on_error, res, a, b, c)
        if ok then return end
    end
    response.fail(req, res, a)
end

return k
