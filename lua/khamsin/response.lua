-- khamsin.response: the `res` object and the turning of a handler's return values into a reply;
-- res:redirect, res:etag and res:last_modified (the 304 itself is the engine's: core/kh_cond.c;
-- the 412 of an unsafe method is raised here), and the plain error pages (M.fail).
-- The forms are body | status, body | status, body, headers; a status is a number (an integer
-- from 200 to 999). Anything else is refused with a message naming the handler's file:line (a
-- 500), never guessed at or dropped: a string status ("201", "x"), a nil first value followed by
-- more (a failed call's nil, err), a fourth value, a body on a 204/304, a header name or value
-- the engine refuses.
local core = require "khamsin.core"
local errors = require "khamsin.errors"

local type, tostring, rawget, setmetatable, pairs, pcall, format =
    type, tostring, rawget, setmetatable, pairs, pcall, string.format
local lower, next = string.lower, next
local respond, log = core.respond, core.log
local raise = errors.raise
errors.own()

local M = {}

-- The runner's own reply with at most two headers, string-valued, goes through the FFI
-- (lua/kh_lua_core.c, kh_lua_respond_fast, which takes up to KH_LUA_FAST_HDRS): the JIT keeps
-- the whole request in one trace, where core.respond ends it. bench/callgrind.sh, wrk -c64,
-- instructions per request before -> after: hello 7,006 -> 5,560; a header set 10,848 -> 6,748;
-- a header read and one set (bench/apps/hello_headers.lua) 13,199 -> 11,539 (req.headers,
-- core.headers, still ends the trace). Absent (plain luajit, the unit specs): core.respond.
-- Declared when first needed (M.ffi_setup), not as the module loads: by the second reply the
-- runner makes (the first goes through core.respond: the interpreter runs a state's first
-- requests, where a lua_CFunction costs no more than an FFI call, and the JIT has nothing to
-- keep yet), or by khamsin.request's first req.method, req.path or req.headers. The FFI's first
-- use and the declarations cost ~80,000 instructions that every state paid on its way to its
-- first answer (bench/startup.sh PARTS=ir, hello app).
local respond_fast, fast_h
local fast_state = 0 -- 0: no reply yet; 1: one made (through core.respond); 2: ffi_setup ran

function M.ffi_setup()
    if fast_state == 2 then return end
    fast_state = 2
    local ffi = require "ffi"
    local C = ffi.C
    -- declared without asking first whether it is (the question, when the answer is no, costs
    -- an error thrown: see req_str in khamsin.request). The type on its own, since a cdef that
    -- redeclares it fails whole (khamsin.request's kh_lua_req_headers uses it too)
    pcall(ffi.cdef, [[typedef struct kh_lua_hdr { const char *name; size_t nlen;
        const char *value; size_t vlen; } kh_lua_hdr;]])
    pcall(ffi.cdef, [[int kh_lua_respond_fast(uint32_t gen, int status, const char *body,
        size_t blen, const char *ctype, size_t ctlen, const kh_lua_hdr *hs, int nh);]])
    local ok, f = pcall(function() return C.kh_lua_respond_fast end)
    if ok then
        respond_fast = f
        -- filled for each reply: pointers into the header table's strings, read by the call
        -- only (no Lua runs in it, so one array per state is enough)
        fast_h = ffi.new("kh_lua_hdr[2]")
    end
end

-- fast_h[i] = k: v (strings: pointers into them, for the call); i + 1, or -1 for a value that is
-- a number, a list or false (core.respond's)
local function fast_put(i, k, v)
    if type(k) ~= "string" or type(v) ~= "string" then return -1 end
    local e = fast_h[i]
    e.name, e.nlen, e.value, e.vlen = k, #k, v, #v
    return i + 1
end

-- A value as a message shows it: 99, "201" (a string), a table.
local function describe(v)
    local t = type(v)
    if t == "number" then return tostring(v) end
    if t == "string" then
        if #v > 40 then v = v:sub(1, 40) .. "..." end
        return format("%q (a string)", v)
    end
    return "a " .. t
end
M.describe = describe

-- A table body is JSON, encoded as k.json.encode does (lua/kh_lua_json.c).
local json_encode = core.json_encode

local function json_body(who, body)
    local out, msg, path = json_encode(body)
    if not out then raise(who .. " a table that cannot be sent as JSON: " .. msg .. ", at " .. path) end
    return out
end

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
    if type(self) ~= "table" or rawget(self, "_s") == nil then
        raise("res:defer() is a method: call it with a colon")
    end
    if opts ~= nil and type(opts) ~= "table" then
        raise("res:defer{timeout = seconds}: the options are a table, got " .. describe(opts))
    end
    return M.deferred().new(self, opts)
end

-- Adds a Set-Cookie header (several calls: several headers). Invalid names, values or options
-- raise at the caller's line (khamsin.cookies has the rules).
function Res:set_cookie(name, value, opts)
    if type(self) ~= "table" or rawget(self, "_s") == nil then
        raise("res:set_cookie() is a method: call it with a colon")
    end
    local cookies = require "khamsin.cookies"
    cookies.add(self, cookies.format(name, value, opts))
end

-- Streamed replies (khamsin.stream, khamsin.sse; loaded on first use). res:write(chunk) sends
-- the head (res.status, res.headers) on its first call, then the chunk (chunked on HTTP/1.1,
-- DATA on HTTP/2); it waits while stream_high_water bytes are queued, and returns nil, "closed"
-- once the client is gone. The handler returning ends the response; res:finish() ends it early.
local function is_res(self) return type(self) == "table" and rawget(self, "_s") ~= nil end

function Res:write(chunk)
    if not is_res(self) then raise("res:write(chunk) is a method: call it with a colon") end
    return require("khamsin.stream").write(self, chunk)
end

function Res:finish()
    if not is_res(self) then raise("res:finish() is a method: call it with a colon") end
    return require("khamsin.stream").finish(self)
end

-- Server-Sent Events: returns the stream (khamsin.sse), which reads Last-Event-ID from the stream.
function Res:sse()
    if not is_res(self) then raise("res:sse() is a method: call it with a colon") end
    return require("khamsin.sse").open(self)
end

local function set_header(res, name, value)
    local h = res.headers
    local l = lower(name)
    for k in pairs(h) do
        if type(k) == "string" and k ~= name and lower(k) == l then h[k] = nil end
    end
    h[name] = value
end

local REDIRECT = { [300] = true, [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

-- return res:redirect(url[, status]): Location and the status (302 by default; 301, 303, 307,
-- 308, 300); a relative URL is allowed (RFC 9110 §10.2.2). A URL with CR, LF or another control
-- byte is refused (it could split the response).
function Res:redirect(url, status)
    if not is_res(self) then raise("res:redirect() is a method: call it with a colon") end
    if type(url) ~= "string" or url == "" or url:find("[%z\1-\32\127]") then
        raise("res:redirect(url[, status]): url must be a non-empty string without spaces or "
            .. "control bytes (percent-encode them), got " .. describe(url))
    end
    status = status or 302
    if not REDIRECT[status] then
        raise("res:redirect(url[, status]): status must be 301, 302, 303, 307, 308 or 300, got "
            .. describe(status))
    end
    set_header(self, "Location", url)
    self.status = status
    return status, nil
end

-- RFC 9110 §8.8.3: entity-tag = [ W/ ] DQUOTE *etagc DQUOTE
local function etag_value(value, weak)
    if type(value) ~= "string" then return nil end
    if value:find('^W/"[^"]*"$') or value:find('^"[^"]*"$') then
        if value:find("[%z\1-\32\127]") then return nil end
        return value
    end
    if value:find('[%z\1-\32"\127]') then return nil end
    return (weak and 'W/"' or '"') .. value .. '"'
end

local core_headers = core.headers

-- The request's field `name`, for a precondition (nil when absent)
local function req_field(res, name)
    local hs = rawget(res, "_reqh")
    if not hs then
        hs = core_headers(res._s, res._g) or {}
        rawset(res, "_reqh", hs)
    end
    return hs[name]
end

local function unsafe(res)
    local m = core.head(res._s, res._g)
    return m ~= nil and m ~= "GET" and m ~= "HEAD"
end

-- entity-tags of an If-Match / If-None-Match value; "*" -> true
local function tag_list(v)
    if v:match("^%s*%*%s*$") then return true end
    local out = {}
    for weak, tag in v:gmatch('%s*(W?/?)("[^"]*")%s*,?') do out[#out + 1] = { weak == "W/", tag } end
    return out
end

-- res:etag(value[, weak]): sets ETag ("value" quoted, or W/"value"; a value already quoted is
-- taken as it is). A GET/HEAD answered 200 becomes 304 when If-None-Match matches (the engine
-- does that, kh_cond.h). For other methods it checks the preconditions at once (RFC 9110
-- §13.2.2): If-Match that does not match (strong comparison), or If-None-Match that does,
-- raise k.fail(412): call it before changing anything.
function Res:etag(value, weak)
    if not is_res(self) then raise("res:etag() is a method: call it with a colon") end
    local tag = etag_value(value, weak)
    if not tag then
        raise("res:etag(value[, weak]): value must be a string of visible ASCII without '\"' "
            .. "(or an entity-tag \"...\" / W/\"...\"), got " .. describe(value))
    end
    set_header(self, "ETag", tag)
    if unsafe(self) then
        local opaque, is_weak = tag:gsub('^W/', ""), tag:sub(1, 2) == "W/"
        local im = req_field(self, "if-match")
        if im then
            local list, ok = tag_list(im), false
            if list == true then ok = true else
                for _, t in ipairs(list) do
                    if not t[1] and not is_weak and t[2] == opaque then ok = true end
                end
            end
            if not ok then errors.fail412("If-Match does not match the current ETag") end
        end
        local inm = req_field(self, "if-none-match")
        if inm then
            local list, hit = tag_list(inm), false
            if list == true then hit = true else
                for _, t in ipairs(list) do if t[2] == opaque then hit = true end end
            end
            if hit then errors.fail412("If-None-Match matches the current ETag") end
        end
    end
    return tag
end

local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8, Sep = 9,
    Oct = 10, Nov = 11, Dec = 12 }

-- IMF-fixdate -> seconds since the epoch (nil when it is not one)
local function parse_date(s)
    local d, mon, y, h, mi, sec = s:match("^%a%a%a, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    local m = MONTHS[mon or ""]
    if not m then return nil end
    y, m = tonumber(y), m
    if m <= 2 then y = y - 1 end
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local doy = math.floor((153 * (m + (m > 2 and -3 or 9)) + 2) / 5) + tonumber(d) - 1
    local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return (era * 146097 + doe - 719468) * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec)
end
M.parse_date = parse_date

-- res:last_modified(time): sets Last-Modified (time: seconds since the epoch, e.g. k.now() or a
-- file's mtime). A GET/HEAD answered 200 becomes 304 when If-Modified-Since is not older (and
-- there is no If-None-Match). For other methods, If-Unmodified-Since older than time raises
-- k.fail(412) at once (when there is no If-Match).
function Res:last_modified(t)
    if not is_res(self) then raise("res:last_modified() is a method: call it with a colon") end
    if type(t) ~= "number" or t ~= t or t < 0 or t > 253402300799 then
        raise("res:last_modified(time): time must be seconds since the epoch (a number from 0), "
            .. "got " .. describe(t))
    end
    t = math.floor(t)
    set_header(self, "Last-Modified", os.date("!%a, %d %b %Y %H:%M:%S GMT", t))
    if unsafe(self) and not req_field(self, "if-match") then
        local ius = req_field(self, "if-unmodified-since")
        local since = ius and parse_date(ius)
        if since and t > since then errors.fail412("modified since If-Unmodified-Since") end
    end
    return t
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

-- Constant values in the constructor: see request.new (a bytecode template keeps only the keys
-- whose value is a constant). res keeps no reference to req: LuaJIT sinks (never allocates) a
-- table that the trace only stores into, but not one stored into another table, so res._req = req
-- made req a real table per request (with res sunk): an allocation, a free and the collector's
-- work for it, ~600 of ~5,100 instructions per h1 hello request (REQUESTS=20000 CONNS=64
-- bench/callgrind.sh: 5,106 -> 4,352). res:sse() reads Last-Event-ID from the stream.
function M.new(s, gen)
    local res = setmetatable({ _s = false, _g = false, status = 200 }, res_mt)
    res._s, res._g = s, gen
    return res
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

local function valid_status(st)
    return type(st) == "number" and st % 1 == 0 and st >= 200 and st <= 999
end

-- return body | status, body | status, body, headers. `who` starts messages ("the handler
-- returned", "d:send got"). own: res is the running request's own (the runner's answer), which
-- may take the FFI path.
function M.finish(res, a, b, c, who, own)
    if rawget(res, "_streaming") then -- res:write / res:sse started the response (khamsin.stream)
        return require("khamsin.stream").ended(res, a, b, c, who)
    end
    who = who or "d:send got"
    local status, body, headers
    if type(a) == "number" then
        status, body, headers = a, b, c
        if not valid_status(status) then
            raise(who .. " the status " .. describe(status) .. ": a status is an integer from "
                .. "200 to 999")
        end
    else
        if b ~= nil or c ~= nil then
            if a == nil then
                raise(who .. " nil, " .. describe(b) .. " (a failed call's nil, err?): to "
                    .. "answer an error, give a status (500, err) or use k.fail")
            end
            raise(who .. " " .. describe(a) .. ", " .. describe(b) .. ": a status must be a "
                .. "number (the forms are body | status, body | status, body, headers)")
        end
        status, body = rawget(res, "status"), a
        if status == nil then
            status = 200
        elseif not valid_status(status) then
            raise("res.status is " .. describe(status) .. ": a status is an integer from 200 "
                .. "to 999")
        end
    end
    if headers ~= nil and type(headers) ~= "table" then
        raise(who .. " the headers " .. describe(headers) .. ": headers are a table")
    end
    local rh = rawget(res, "headers")
    if rh ~= nil and type(rh) ~= "table" then
        raise("res.headers is " .. describe(rh) .. ": headers are a table")
    end
    headers = merge(rh, headers)
    local ctype
    local t = type(body)
    if t == "string" then
        ctype = TEXT
    elseif t == "table" then
        body, ctype = json_body(who, body), JSON
    elseif t == "nil" then
        body = ""
    elseif t == "number" then
        body, ctype = tostring(body), TEXT
    else
        raise(who .. " " .. describe(body) .. " as the body (a body is a string, a table sent "
            .. "as JSON, a number or nil)")
    end
    if status == 204 or status == 304 then
        if body ~= "" then
            raise(who .. " a " .. #body .. "-byte body with the status " .. status .. ", which "
                .. "has none (RFC 9110 §15.3.5, §15.4.5)")
        end
        ctype = nil
    end
    if own and fast_state ~= 2 then -- the first reply: core.respond; the second sets up
        if fast_state == 0 then fast_state = 1 else M.ffi_setup() end
    end
    if own and respond_fast then
        -- up to two headers, unrolled: a loop here would be an inner loop of the request's
        -- trace, which LuaJIT does not record ("inner loop in root trace"); more: core.respond
        local nh = 0
        if headers ~= nil then
            local k, v = next(headers)
            if k ~= nil then
                nh = fast_put(0, k, v)
                if nh > 0 then
                    k, v = next(headers, k)
                    if k ~= nil then
                        nh = fast_put(1, k, v)
                        if nh > 0 and next(headers, k) ~= nil then nh = -1 end
                    end
                end
            end
        end
        if nh >= 0 then
            local r = respond_fast(res._g, status, body, #body, ctype, ctype and #ctype or 0,
                fast_h, nh)
            if r ~= 1 then return end -- 0: sent; 2: the stream is gone (core.respond's nil)
        end
    end
    local ok, err = respond(res._s, res._g, status, body, headers, ctype)
    if ok == false then raise(err) end -- a header the engine refuses, a second answer
end

-- The headers a reply carries onto an error page: what the handler or a middleware put in
-- res.headers (CORS, Vary, cookies...), except the fields that describe a body other than the
-- page's own.
local function error_headers(res)
    local rh = rawget(res, "headers")
    if type(rh) ~= "table" then return nil end
    local out
    for k, v in pairs(rh) do
        if type(k) == "string" then
            local l = lower(k)
            if l ~= "content-type" and l ~= "content-length" and l ~= "content-encoding"
                    and l ~= "content-range" and l ~= "etag" and l ~= "last-modified" then
                out = out or {}
                out[k] = v
            end
        end
    end
    return out
end

-- Logs a handler's bug (the traceback) as an [error] line.
function M.log_error(req, e)
    local tb = type(e) == "table" and e.traceback or tostring(e)
    -- core.log starts the line with "request <id>: " (it runs in the request's coroutine)
    log(0, "handler error on " .. tostring(req.method) .. " "
        .. tostring(req.path) .. ": " .. tb)
    return tb
end

-- The handler (or finish) raised e: an HTTP error from k.fail, or a bug (logged, 500). The page
-- carries res.headers (error_headers). logged: the bug was logged already (khamsin.middleware).
function M.fail(req, res, e, logged)
    if defer then defer.drop(res) end -- nothing to drop before the first res:defer()
    local sse = rawget(res, "_sse") -- res:sse() (khamsin.sse): its stream ends with the handler
    if sse then sse:_ended() end
    if errors.is_aborted(e) then return end -- the engine answered, or nobody is listening
    local h = error_headers(res)
    if errors.is_busy(e) then
        h = h or {}
        h["Retry-After"] = "1"
        respond(res._s, res._g, 503, "Service Unavailable: " .. tostring(e.reason) .. "\n", h, TEXT)
        return
    end
    if errors.is_http(e) then
        local msg = e.message
        if e.status == 204 or e.status == 304 then -- no content (RFC 9110 §15.3.5, §15.4.5)
            respond(res._s, res._g, e.status, "", h, nil)
            return
        end
        if type(msg) == "table" then -- k.fail(400, {error = "bad"}): JSON, as a returned table
            local out, emsg, path = json_encode(msg)
            if out then
                respond(res._s, res._g, e.status, out, h, JSON)
                return
            end
            msg = "(k.fail's table message cannot be sent as JSON: " .. emsg .. ", at " .. path .. ")"
        elseif msg == nil then
            msg = core.reason(e.status) -- k.fail(404): "Not Found"
        end
        respond(res._s, res._g, e.status, tostring(msg) .. "\n", h, TEXT)
        return
    end
    if not logged then M.log_error(req, e) end
    local body, ctype = "Internal Server Error\n", TEXT
    if core.dev then -- message, source lines and traceback; never without --dev
        body, ctype = require("khamsin.devpage").render(req.headers.accept, e, json_encode)
    end
    respond(res._s, res._g, 500, body, h, ctype)
end

return M
