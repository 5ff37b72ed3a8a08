-- khamsin.response: the `res` object and the turning of a handler's return values into a reply.
local core = require "khamsin.core"
local cjson -- loaded on the first table body (a dlopen saved at start-up)
local errors = require "khamsin.errors"

local type, tostring, rawget, setmetatable, pairs = type, tostring, rawget, setmetatable, pairs
local lower = string.lower
local respond, log = core.respond, core.log

local M = {}

local TEXT = "text/plain; charset=utf-8"
local JSON = "application/json"

-- khamsin.defer is required by the first res:defer() or k.resolve (M.deferred), not at start-up:
-- most apps never defer, and each module loaded costs every worker's start a few pages.
local defer

function M.deferred()
    if not defer then
        defer = require "khamsin.defer"
        defer.set_finish(M.finish)
    end
    return defer
end

local Res = {}

-- Keeps the request open after the handler returns; answer it later with d:send(status, body,
-- headers) from a timer, another request, the pool, or another worker (k.resolve(d.id, ...)).
-- opts.timeout (seconds; default the defer_timeout_ms limit) answers 504 when it passes.
function Res:defer(opts)
    return M.deferred().new(self, opts)
end

local res_mt = {
    __index = function(res, key)
        if key == "headers" then
            local h = {}
            res.headers = h
            return h
        end
        return Res[key]
    end,
}

function M.new(s, gen)
    return setmetatable({ _s = s, _g = gen, status = 200 }, res_mt)
end

-- Merges extra headers over res.headers, case-insensitively.
local function merge(base, extra)
    if not base then return extra end
    if not extra then return base end
    local out = {}
    for k, v in pairs(base) do out[k] = v end
    for k, v in pairs(extra) do
        if type(k) == "string" then
            local l = lower(k)
            for ok in pairs(out) do
                if type(ok) == "string" and ok ~= k and lower(ok) == l then out[ok] = nil end
            end
        end
        out[k] = v
    end
    return out
end

-- return body | status, body | status, body, headers
function M.finish(res, a, b, c)
    local status, body, headers
    if type(a) == "number" then
        status, body, headers = a, b, c
    else
        status, body = rawget(res, "status") or 200, a
    end
    if status ~= status or status < 200 or status > 999 or status % 1 ~= 0 then
        error("invalid status " .. tostring(status), 0)
    end
    if headers ~= nil and type(headers) ~= "table" then
        error("response headers must be a table, got a " .. type(headers), 0)
    end
    headers = merge(rawget(res, "headers"), headers)
    local ctype
    local t = type(body)
    if t == "string" then
        ctype = TEXT
    elseif t == "table" then
        cjson = cjson or require "cjson"
        body, ctype = cjson.encode(body), JSON
    elseif t == "nil" then
        body = ""
    elseif t == "number" then
        body, ctype = tostring(body), TEXT
    else
        error("a handler returned a " .. t .. " as the body (expected a string or a table)", 0)
    end
    respond(res._s, res._g, status, body, headers, ctype)
end

-- The handler (or finish) raised e: an HTTP error from k.fail, or a bug (logged, 500).
function M.fail(req, res, e)
    if defer then defer.drop(res) end -- nothing to drop before the first res:defer()
    if errors.is_aborted(e) then return end -- the engine answered, or nobody is listening
    if errors.is_busy(e) then
        respond(res._s, res._g, 503, "Service Unavailable: " .. tostring(e.reason) .. "\n",
            { ["Retry-After"] = "1" }, TEXT)
        return
    end
    if errors.is_http(e) then
        local msg = tostring(e.message or "")
        respond(res._s, res._g, e.status, msg .. "\n", nil, TEXT)
        return
    end
    local tb = type(e) == "table" and e.traceback or tostring(e)
    log(0, "handler error on " .. tostring(req.method) .. " " .. tostring(req.path) .. ": " .. tb)
    local body = "Internal Server Error\n"
    if core.dev then body = "Internal Server Error\n\n" .. tb .. "\n" end
    respond(res._s, res._g, 500, body, nil, TEXT)
end

return M
