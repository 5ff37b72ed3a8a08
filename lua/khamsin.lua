-- khamsin: the public module. Loaded once in every worker's own Lua state.
-- Owns: route registration and the request runner (_run), which turns a handler's return values
-- into a response. Knows nothing of wire formats: everything goes through khamsin.core.
local core = require "khamsin.core"
local request = require "khamsin.request"
local response = require "khamsin.response"
local errors = require "khamsin.errors"

local type, error, tostring, select = type, error, tostring, select
local xpcall, traceback = xpcall, debug.traceback
local concat = table.concat

local k = {}

-- k.fail(status, message) answers with that status (not logged as a bug).
function k.fail(status, message)
    error(errors.http(status, message), 2)
end

-- A wait raises k.is_aborted(e) errors once the request is over; pcall cleanups may check it.
k.is_aborted = errors.is_aborted

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
local is_http, is_aborted = errors.is_http, errors.is_aborted

local function on_error(e)
    if is_http(e) or is_aborted(e) then return e end
    local msg = type(e) == "string" and e or ("(error object is a " .. type(e) .. " value: "
        .. tostring(e) .. ")")
    return { traceback = traceback(msg, 2) }
end

local new_req, new_res, finish = request.new, response.new, response.finish

local function serve(handler, req, res)
    return finish(res, handler(req, res))
end

function k._run(handler, s, gen)
    local req, res = new_req(s, gen), new_res(s, gen)
    local ok, e = xpcall(serve, on_error, handler, req, res)
    if not ok then response.fail(req, res, e) end
end

return k
