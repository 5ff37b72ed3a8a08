-- khamsin: the public module. Loaded once in every worker's own Lua state.
-- Owns: route registration and the request runner (_run), which turns a handler's return values
-- into a response; with k.use / k.on_error, _run becomes run_chain (khamsin.middleware) and
-- unmatched requests reach the app too. k.cors is khamsin.cors. Knows nothing of wire formats: everything goes through khamsin.core.
-- A misuse of the API (a wrong argument, a wait while the script loads, a value that cannot be
-- copied) raises errors.raise(msg): the message names the app's file:line, not this file's.
local core = require "khamsin.core"
local request = require "khamsin.request"
local response = require "khamsin.response"
local errors = require "khamsin.errors"

local type, error, tostring, select = type, error, tostring, select
local xpcall, traceback = xpcall, debug.traceback
local concat = table.concat
local raise = errors.raise
errors.own()

local k = {}

-- k.fail(status, message) answers with that status (not logged as a bug). A table message is
-- sent as JSON, like a returned table.
function k.fail(status, message)
    if core.loading() then raise("k.fail answers a request: call it from a handler") end
    if type(status) ~= "number" or status % 1 ~= 0 or status < 200 or status > 999 then
        raise("k.fail(status, message): status must be an integer from 200 to 999, got "
            .. response.describe(status))
    end
    local t = type(message)
    if t ~= "nil" and t ~= "string" and t ~= "number" and t ~= "table" then
        raise("k.fail(status, message): message must be a string or a table (sent as JSON), "
            .. "got a " .. t)
    end
    error(errors.http(status, message), 2)
end

-- A wait raises k.is_aborted(e) errors once the request is over; pcall cleanups may check it.
k.is_aborted = errors.is_aborted

local loading = core.loading

local function add(what, method, path, fn, opts)
    if not loading() then
        raise(what .. ": routes are declared while the script loads (every worker loads it; a "
            .. "route added later would exist on this worker only)")
    end
    if type(path) ~= "string" then
        raise(what .. "(path, fn): the path must be a string, got a " .. type(path))
    end
    if type(fn) ~= "function" then
        raise(what .. "(path, fn): the handler must be a function, got a " .. type(fn))
    end
    if path:find("[?#]") then
        raise(what .. "(path, fn): '" .. path .. "' has a '?' or '#': a route matches the path "
            .. "only (the query is req.query, req.args)")
    end
    -- opts.stream_body: the handler reads the body with req:body_reader(), so a body of any
    -- declared length is taken (under body_window), not answered 413 past body_bytes
    if opts ~= nil and (type(opts) ~= "table" or (opts.stream_body ~= nil and type(opts.stream_body) ~= "boolean")) then
        raise(what .. "(path, fn, opts): opts is a table { stream_body = true|false }")
    end
    local ok, err = core.route(method, path, fn, opts ~= nil and opts.stream_body == true)
    if not ok then raise(err) end
    request.patterns[err] = path -- the route's ref -> its pattern, for req.route
end

for _, m in ipairs { "get", "post", "put", "patch", "delete", "options" } do
    local method, what = m:upper(), "k." .. m
    k[m] = function(path, fn, opts) add(what, method, path, fn, opts) end
end

function k.any(path, fn, opts) add("k.any", "*", path, fn, opts) end

local KNOWN = { GET = 1, HEAD = 1, POST = 1, PUT = 1, PATCH = 1, DELETE = 1, OPTIONS = 1,
    CONNECT = 1, TRACE = 1 }

function k.route(method, path, fn, opts)
    if type(method) ~= "string" then
        raise("k.route(method, path, fn): the method must be a string, got a " .. type(method))
    end
    if method ~= method:upper() and KNOWN[method:upper()] then
        raise("k.route: methods are case-sensitive (RFC 9110 §9.1): '" .. method .. "' would "
            .. "never match a " .. method:upper() .. " request; write \"" .. method:upper() .. "\"")
    end
    add("k.route", method, path, fn, opts)
end

-- k.websocket(path, {open=, message=, close=, origin=, protocols=}): a WebSocket endpoint,
-- reached by an h1 GET + Upgrade and an h2 extended CONNECT alike (khamsin.websocket).
function k.websocket(path, handlers)
    require("khamsin.websocket").route(add, path, handlers)
end

-- Files under dir served at prefix (khamsin.static has the rules).
function k.static(prefix, dir, opts) require("khamsin.static").register(k, prefix, dir, opts) end

function k.worker_id() return core.worker_id() end
function k.workers() return core.workers() end
function k.now() return core.now() end

-- The app script's directory (absolute), for the app's own files: io.open(k.app_dir() .. "/x")
local app_dir
function k.app_dir()
    app_dir = app_dir or core.app_dir()
    return app_dir
end

-- Waits. Each raises errors.aborted once the request is over (so pcall cleanups run).
local core_sleep, core_timer, core_blocking = core.sleep, core.timer, core.blocking
local is_busy = errors.is_busy

local function waited(st, a, ...)
    if st == true then return a, ... end
    if st == "aborted" then error(errors.aborted(a), 0) end
    if st == "busy" then error(errors.busy(a), 0) end
    if st == "misuse" then raise(a) end -- called while the script loads, a value not copyable
    error(a, 0) -- "error": the pool function raised; a carries the pool's traceback
end

-- seconds for k.sleep/timer/every: a number from 0 to 1e9 (what the C side accepts)
local function check_seconds(what, s)
    if type(s) ~= "number" or not (s >= 0 and s <= 1e9) then
        raise(what .. ": seconds must be a number from 0 to 1e9, got " .. response.describe(s))
    end
end

-- Sleeps without blocking the loop (k.sleep(0): until the next loop turn).
function k.sleep(seconds)
    check_seconds("k.sleep(seconds)", seconds)
    waited(core_sleep(seconds))
end

-- fn() runs once after `seconds`, in a coroutine of its own (it may sleep or use the pool).
function k.timer(seconds, fn)
    check_seconds("k.timer(seconds, fn)", seconds)
    if type(fn) ~= "function" then
        raise("k.timer(seconds, fn): fn must be a function, got a " .. type(fn))
    end
    return core_timer(seconds, nil, fn)
end

-- fn() runs every `seconds` until :cancel().
function k.every(seconds, fn)
    check_seconds("k.every(seconds, fn)", seconds)
    if seconds == 0 then raise("k.every(seconds, fn): the interval must be above 0, got 0") end
    if type(fn) ~= "function" then
        raise("k.every(seconds, fn): fn must be a function, got a " .. type(fn))
    end
    return core_timer(seconds, seconds, fn)
end

-- Runs fn(...) on a pool thread, in that thread's own Lua state, and returns its results.
-- fn is a function without upvalues (moved with string.dump) or "module.function" (required
-- in the pool state). Arguments and results are copied. A full queue raises errors.busy (503).
local dumped = setmetatable({}, { __mode = "k" })
local getinfo, dump = debug.getinfo, string.dump

function k.blocking(fn, ...)
    local kind, code
    if type(fn) == "string" then
        kind, code = "n", fn
    elseif type(fn) == "function" then
        kind, code = "b", dumped[fn]
        if not code then
            local info = getinfo(fn, "uS")
            if info.what == "C" then
                raise("k.blocking: a C function cannot be moved to the pool; name it as "
                    .. "\"module.function\" instead")
            end
            if info.nups > 0 then
                raise("k.blocking: the function has " .. info.nups .. " upvalue(s) (local "
                    .. "variables from outside it); functions move to the pool by string.dump, "
                    .. "which drops upvalues: pass them as arguments, or name a module function "
                    .. "as \"module.function\"")
            end
            code = dump(fn)
            dumped[fn] = code
        end
    else
        raise("k.blocking: expected a function or \"module.function\", got a " .. type(fn))
    end
    return waited(core_blocking(kind, code, ...))
end

k.is_busy = is_busy

-- Workers that talk.
local subscribers = {}

-- fn(value, topic) runs on every worker for each k.publish(topic, value), in a coroutine.
function k.subscribe(topic, fn)
    if type(topic) ~= "string" then
        raise("k.subscribe(topic, fn): topic must be a string, got a " .. type(topic))
    end
    if type(fn) ~= "function" then
        raise("k.subscribe(topic, fn): fn must be a function, got a " .. type(fn))
    end
    local list = subscribers[topic]
    if not list then list = {}; subscribers[topic] = list end
    list[#list + 1] = fn
    return function() -- unsubscribe
        for i = #list, 1, -1 do if list[i] == fn then table.remove(list, i) end end
    end
end

-- Sends a copy of value to every worker's subscribers of topic (this worker's too, after the
-- current handler yields or returns). Returns the number of workers reached.
function k.publish(topic, value)
    if type(topic) ~= "string" then
        raise("k.publish(topic, value): topic must be a string, got a " .. type(topic))
    end
    local n, err = core.publish(topic, value)
    if not n then raise(err) end -- a value that cannot be copied
    return n
end

-- Writes data to a push target (an SSE stream's sse.id, a WebSocket's ws.id) from anywhere:
-- another request, a timer, a pool result, another worker. Never yields; a target whose
-- consumer is too slow (stream_out_cap queued) is ended rather than buffered. On the target's
-- worker: true | nil, "closed" | nil, "gone"; to another worker: true once posted.
function k.send_to(id, data)
    return require("khamsin.push").send_to(id, data)
end

-- Signed values (cookies, tokens): value .. "." .. base64url(HMAC-SHA256(key, value)).
-- k.unsign takes a key or a list of keys (the first is current, the others still accepted while
-- they rotate out) and returns the value, or nil when no key's signature matches.
local MIN_KEY = 16

local function check_key(what, key)
    if type(key) ~= "string" or #key < MIN_KEY then
        raise(what .. ": the key must be a string of at least " .. MIN_KEY .. " bytes (a random "
            .. "secret), got " .. (type(key) == "string" and (#key .. " bytes") or ("a " .. type(key))))
    end
end

function k.sign(key, value)
    check_key("k.sign(key, value)", key)
    if type(value) ~= "string" then
        raise("k.sign(key, value): value must be a string, got a " .. type(value))
    end
    return core.sign(key, value)
end

function k.unsign(key, signed)
    if type(key) == "table" then
        for i = 1, #key do check_key("k.unsign(keys, signed): key " .. i, key[i]) end
        if #key == 0 then raise("k.unsign(keys, signed): the list of keys is empty") end
    else
        check_key("k.unsign(key, signed)", key)
    end
    if signed == nil then return nil end -- req.cookies.missing
    if type(signed) ~= "string" then
        raise("k.unsign(key, signed): signed must be a string, got a " .. type(signed))
    end
    if type(key) == "string" then return core.unsign(key, signed) end
    for i = 1, #key do
        local v = core.unsign(key[i], signed)
        if v then return v end
    end
    return nil
end

-- khamsin.defer and khamsin.shared load on first use, not with the app (start-up time).
local deferred = response.deferred

-- Answers the deferred reply `id` (d.id), on whichever worker holds it.
function k.resolve(id, status, body, headers)
    return deferred().resolve(id, status, body, headers)
end

-- k.shared_dict and k.shared are khamsin.shared's own functions (their errors name the caller's
-- line), fetched the first time either is looked up; k.json (khamsin.json) likewise.
setmetatable(k, {
    __index = function(t, key)
        if key == "json" then
            local json = require "khamsin.json"
            rawset(t, "json", json)
            return json
        end
        if key == "http" then -- k.http: the HTTP client (khamsin.http)
            local http = require "khamsin.http"
            rawset(t, "http", http)
            return http
        end
        if key == "socket" then -- k.socket: outbound TCP/TLS (khamsin.socket)
            local socket = require "khamsin.socket"
            rawset(t, "socket", socket)
            return socket
        end
        if key ~= "shared_dict" and key ~= "shared" then return nil end
        local shared = require "khamsin.shared"
        rawset(t, "shared_dict", shared.declare)
        rawset(t, "shared", shared.get)
        return rawget(t, key)
    end,
})

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
    if is_http(e) or is_aborted(e) or is_busy(e) then return e end
    local mt = type(e) == "table" and getmetatable(e)
    local msg = (type(e) == "string" or (mt and mt.__tostring)) and tostring(e)
        or ("(error object is a " .. type(e) .. " value: " .. tostring(e) .. ")")
    local err = { traceback = traceback(msg, 2) }
    if core.dev then -- the --dev error page's message and source (khamsin/devpage.lua)
        err.message, err.where = msg, require("khamsin.devpage").locate(msg, 2)
    end
    return err
end

local new_req, new_res, finish = request.new, response.new, response.finish

-- Callbacks that run in a coroutine of their own (timers, subscribers, resolves, aborts of
-- deferred replies): an error is logged, never raised into the engine.
local function run_logged(what, fn, ...)
    local ok, e = xpcall(fn, on_error, ...)
    if not ok and not is_aborted(e) then
        local tb = type(e) == "table" and e.traceback or tostring(e)
        core.log(0, what .. " failed: " .. tostring(tb))
    end
end

local events = {
    timer = function(fn) run_logged("timer callback", fn) end,
    publish = function(topic, value)
        local list = subscribers[topic]
        if not list then return end
        for _, fn in ipairs(list) do
            run_logged("subscriber of '" .. topic .. "'", fn, value, topic)
        end
    end,
    resolve = function(id, status, body, headers) deferred().on_resolve(id, status, body, headers) end,
    abort = function(s)
        local st = package.loaded["khamsin.stream"] -- a held SSE / WebSocket stream
        if st and st.on_abort(s) then return end
        deferred().on_abort(s)
    end,
    send_to = function(id, data) require("khamsin.push").on_message(id, data) end,
    -- input on a held tunnel (a WebSocket between messages), in a coroutine that owns the stream
    tunnel = function(s, g)
        local st = package.loaded["khamsin.stream"]
        local obj = st and st.held[s]
        if obj and obj ~= true then obj:_readable(g) end
    end,
}

function k._event(kind, ...)
    local fn = events[kind]
    if fn then fn(...) end
end

-- Middleware and error handlers (khamsin.middleware, loaded by the first k.use / k.on_error /
-- k.cors): with them every request, matched or not, runs through the chain.
-- The first one swaps k._run for run_chain (the engine resolves k._run once the script has
-- loaded), so an app without them runs exactly the direct path.
local mw, run_chain

function k.use(prefix, fn)
    mw = mw or require "khamsin.middleware"
    mw.use(prefix, fn)
    k._run = run_chain
end

function k.on_error(status, fn)
    mw = mw or require "khamsin.middleware"
    mw.on_error(status, fn)
    k._run = run_chain
end

-- k.cors{...} returns a middleware: k.use(k.cors{origins = {"https://app.example"}})
function k.cors(opts)
    return require("khamsin.cors").new(opts)
end

-- One xpcall per request: the handler, then the turning of its return values into a reply.
-- (errors.where names `handler`, serve's first argument, when the app's frames are gone.)
local function answer(res, n, a, b, c)
    if rawget(res, "_deferred") then return end -- answered later, by d:send
    if n > 3 then
        raise("the handler returned " .. n .. " values; the forms are body | status, body | "
            .. "status, body, headers")
    end
    return finish(res, a, b, c, "the handler returned", true) -- own: res is this request's
end

local function counted(...) return select("#", ...), ... end

local function serve(handler, req, res)
    answer(res, counted(handler(req, res))) -- not a tail call: serve stays on the stack
end
errors.set_runner(serve)

function k._run(handler, s, gen, p)
    local req = new_req(s, gen, p)
    local res = new_res(s, gen)
    local ok, e = xpcall(serve, on_error, handler, req, res)
    if not ok then response.fail(req, res, e) end
    if rawget(req, "_tmpfiles") then request.cleanup(req) end -- req:multipart's temp files
end

-- With middleware or error handlers: the chain (khamsin.middleware), and errors through k.on_error.
local function serve_chain(handler, req, res)
    local n, a, b, c = counted(mw.chain(handler, req, res))
    if b == mw.ENGINE then error(errors.http(a), 0) end -- the engine's 404/405, passed on
    answer(res, n, a, b, c)
end

function run_chain(handler, s, gen, p)
    local req = new_req(s, gen, p)
    local res = new_res(s, gen)
    local ok, e = xpcall(serve_chain, on_error, handler, req, res)
    if not ok then mw.fail(req, res, e, answer) end
end

return k
