-- khamsin.request: the `req` object. Fields are fetched from the engine on first use and cached
-- in the table, so a handler that never looks at headers never builds a header table.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
local response = require "khamsin.response" -- its ffi_setup (the FFI's declarations, below)
errors.own()
local raise = errors.raise

local rawget, rawset, setmetatable, type, tostring = rawget, rawset, setmetatable, type, tostring
local tonumber, char, gsub, lower, find = tonumber, string.char, string.gsub, string.lower, string.find
local core_head, core_headers, core_params, core_body = core.head, core.headers, core.params, core.body

local M = {}

-- The request's temp files (req:multipart{files = "disk"}) go when its handler returns.
function M.cleanup(req)
    local list = rawget(req, "_tmpfiles")
    if list then require("khamsin.multipart").cleanup(list) end
end

local function hexchar(h) return char(tonumber(h, 16)) end

-- application/x-www-form-urlencoded: "+" is a space (the query, req.args)
local function unescape(s)
    s = gsub(s, "+", " ")
    return (gsub(s, "%%(%x%x)", hexchar))
end
M.unescape = unescape

-- RFC 3986 percent-decoding (path params): "+" stays "+", "%2F" becomes "/". The engine has
-- already answered 400 for a bad escape, %00, non-UTF-8, or a param that would decode to a ".."
-- segment (core/kh_path.c), so what this returns is UTF-8 with no NUL and no traversal.
local function unescape_path(s)
    if not find(s, "%", 1, true) then return s end
    return (gsub(s, "%%(%x%x)", hexchar))
end
M.unescape_path = unescape_path

-- "a=1&b=x%20y&b=2" -> { a = "1", b = { "x y", "2" } }; a key without '=' is true.
local function parse_args(q)
    local args = {}
    if not q then return args end
    for pair in q:gmatch("[^&]+") do
        local key, val = pair:match("^([^=]*)=(.*)$")
        if key then
            key, val = unescape(key), unescape(val)
        else
            key, val = unescape(pair), true
        end
        local prev = args[key]
        if prev == nil then
            args[key] = val
        elseif type(prev) == "table" then
            prev[#prev + 1] = val
        else
            args[key] = { prev, val }
        end
    end
    return args
end
M.parse_args = parse_args

-- Header names are stored lower-case; a lookup in any case finds them (RFC 9110 §5.1).
local headers_mt = {
    __index = function(t, key)
        if type(key) == "string" then
            local l = lower(key)
            if l ~= key then return rawget(t, l) end
        end
    end,
}

local fields = {}

-- route ref -> pattern ("/users/:id"), filled by khamsin.lua as routes are declared
M.patterns = {}

-- req.route: the pattern of the route that matched, or nil (a request no route answers, seen
-- by middleware and error handlers)
function fields.route(req)
    local ref = core.route_of(rawget(req, "_s"), rawget(req, "_g"))
    local p = ref and M.patterns[ref]
    if p then rawset(req, "route", p) end
    return p
end

-- req.path is the normal form the router matched (dot segments removed, "//" merged, unreserved
-- escapes decoded; core/kh_path.h); req.target is the request-target as sent.
local function load_head(req)
    local method, path, query, target, authority, version, remote, scheme =
        core_head(rawget(req, "_s"), rawget(req, "_g"))
    rawset(req, "scheme", scheme)
    rawset(req, "method", method)
    rawset(req, "path", path)
    rawset(req, "query", query or false)
    rawset(req, "target", target)
    rawset(req, "authority", authority)
    rawset(req, "version", version)
    rawset(req, "remote_addr", remote)
end

for _, f in ipairs { "query", "target", "authority", "version", "remote_addr", "scheme" } do
    fields[f] = function(req)
        load_head(req)
        local v = rawget(req, f)
        if v == false then return nil end
        return v
    end
end

-- req.method and req.path through the FFI (lua/kh_lua_core.c, kh_lua_req_str), each on its own:
-- the JIT keeps the handler in its trace, where core.head (all eight fields, the peer address
-- formatted) ended it. Without the accessor (plain luajit, or no req._p): load_head.
-- req.headers through the FFI (lua/kh_lua_core.c, kh_lua_req_headers): the fields' bytes are
-- copied into the table here, so the JIT keeps the handler in its trace, where core.headers (a
-- lua_CFunction) ended it and the rest of the request ran in the interpreter. The table is the
-- same: every field, names lower-case, a repeated field joined with ", " (cookie: "; "), any-case
-- lookup through headers_mt, a plain table the app may iterate, change and keep.
-- Without the accessor (plain luajit, or no req._p: a held WebSocket's req): core.headers.
-- Both are declared by the first read of req.method, req.path or req.headers (ffi_setup), not as
-- the module loads: the FFI's first use (its ctype state, ~41,000 instructions) and the
-- declarations (~35,000) were paid by every state on its way to its first answer, also by an app
-- that never reads these fields (bench/startup.sh PARTS=ir). khamsin.response's declarations
-- come with them (M.ffi_setup there), so that a state has all of khamsin's or none.
local req_str, req_headers
local ffi_pending = true

local function ffi_setup()
    ffi_pending = false
    response.ffi_setup()
    local ffi = require "ffi"
    local C = ffi.C
    -- declared without asking first: a missing declaration is an error, and an error thrown
    -- unwinds through DWARF (~25,000 instructions and 1-3 page faults of .eh_frame at every
    -- state's start); declaring a function again is none (the pcall is for anything else)
    pcall(ffi.cdef, [[const char *kh_lua_req_str(uintptr_t p, uint32_t gen, int which,
        size_t *len);]])
    local ok = pcall(function() return C.kh_lua_req_str end)
    if ok then
        local len, ffistring = ffi.new("size_t[1]"), ffi.string
        req_str = function(req, which)
            local ptr = C.kh_lua_req_str(rawget(req, "_p"), rawget(req, "_g"), which, len)
            if ptr == nil then return nil end
            return ffistring(ptr, len[0])
        end
    end
    -- declared without asking first (as kh_lua_req_str above: each "no" is an error thrown);
    -- the type kh_lua_hdr came with khamsin.response's (response.ffi_setup, just above)
    pcall(ffi.cdef, [[int kh_lua_req_headers(uintptr_t p, uint32_t gen, kh_lua_hdr *out,
        int max);]])
    if pcall(function() return C.kh_lua_req_headers end) then
        local ffistring, hdr_array, tnew = ffi.string, ffi.typeof("kh_lua_hdr[?]"), require "table.new"
        local function put(h, e)
            local name, value = ffistring(e.name, e.nlen), ffistring(e.value, e.vlen)
            local prev = h[name]
            if prev then -- RFC 9110 §5.3: a repeated field is the comma-joined list
                value = prev .. (name == "cookie" and "; " or ", ") .. value
            end
            h[name] = value
        end
        -- fill(h, buf, n): put(h, buf[i]) for i = 0 .. n - 1, the first UNROLL unrolled: a loop
        -- is an inner loop of the request's trace, which LuaJIT gives a trace of its own whose
        -- exit returns to the interpreter, so that the rest of the handler ran there.
        -- bench/callgrind.sh, wrk -c64, APP=bench/apps/hello_headers.lua, instructions per
        -- request with wrk's one field / HEADERS=browser (10 fields): see the commit message.
        -- Made by the first req.headers, not as the module loads: parsing it costs ~200,000
        -- instructions, which every state paid on its way to its first answer (bench/startup.sh).
        local UNROLL = 24
        local fill
        local function make_fill()
            local src = { "local put = ... return function(h, buf, n) " }
            for i = 0, UNROLL - 1 do
                src[#src + 1] = ("if n <= %d then return end put(h, buf[%d]) "):format(i, i)
            end
            src[#src + 1] = ("for i = %d, n - 1 do put(h, buf[i]) end end"):format(UNROLL)
            fill = assert(loadstring(table.concat(src), "=khamsin.request.fill"))(put)
        end
        -- one array per state, refilled by each call; grown for a request with more fields.
        -- The only Lua that can run between the fill and the copies is a __gc finalizer (a GC
        -- step on an allocation), which might read another request's headers: such a nested
        -- call gets nil (core.headers' path) rather than the array the outer one is reading.
        local cap, busy = 32, false
        local buf = hdr_array(cap)
        req_headers = function(p, gen)
            if busy then return nil end
            busy = true
            local n = C.kh_lua_req_headers(p, gen, buf, cap)
            if n > cap then
                cap = n
                buf = hdr_array(cap)
                n = C.kh_lua_req_headers(p, gen, buf, cap)
            end
            local h = tnew(0, n)
            if not fill then make_fill() end
            fill(h, buf, n)
            busy = false
            return h
        end
    end
    M.headers_ffi = req_headers ~= nil -- for spec/req_headers_spec.lua
end
M.headers_ffi = false -- until ffi_setup

for which, f in pairs { [0] = "method", [1] = "path" } do
    fields[f] = function(req)
        if ffi_pending then ffi_setup() end
        if req_str and rawget(req, "_p") then
            local v = req_str(req, which)
            if v then rawset(req, f, v) end
            return v
        end
        load_head(req)
        return rawget(req, f)
    end
end

function fields.headers(req)
    if ffi_pending then ffi_setup() end
    local p, h = rawget(req, "_p"), nil
    if req_headers and p then h = req_headers(p, rawget(req, "_g")) end
    if not h then h = core_headers(rawget(req, "_s"), rawget(req, "_g")) end
    setmetatable(h, headers_mt)
    rawset(req, "headers", h)
    return h
end

function fields.params(req)
    local p = core_params(rawget(req, "_s"), rawget(req, "_g"))
    for k, v in pairs(p) do p[k] = unescape_path(v) end
    rawset(req, "params", p)
    return p
end

-- req.id: the client's X-Request-Id when sane, else one the engine made (core/kh_reqid.h); the
-- client's goes back in the X-Request-Id response header, and so does any id on a 5xx (limit
-- request_id_header: 2 sends it on every reply, 0 never), and into the logs
function fields.id(req)
    local id = core.request_id(rawget(req, "_s"), rawget(req, "_g"))
    rawset(req, "id", id)
    return id
end

-- req.cookies: the Cookie header parsed (khamsin.cookies, loaded on first use)
function fields.cookies(req)
    local c = require("khamsin.cookies").parse(req.headers.cookie)
    rawset(req, "cookies", c)
    return c
end

function fields.args(req)
    local a = parse_args(req.query)
    rawset(req, "args", a)
    return a
end

local Req = {}

local function is_req(self) return type(self) == "table" and rawget(self, "_s") ~= nil end

-- Returns the whole body, waiting for it. When the request is over before the body is in (the
-- client left; past body_bytes the engine already answered 413) it raises an abort error.
function Req:body()
    if not is_req(self) then raise("req:body() is a method: call it with a colon") end
    local cached = rawget(self, "_body")
    if cached then return cached end
    local body, err = core_body(rawget(self, "_s"), rawget(self, "_g"))
    if body == false then raise(err) end -- waited outside its own handler, or twice at once
    if not body then error(errors.aborted(err), 0) end
    rawset(self, "_body", body)
    return body
end

-- An iterator of the body's chunks as they arrive, under a bounded window (body_window: the
-- engine reads no further until the handler takes what is buffered), so a large upload never
-- sits in memory whole; body_bytes does not apply. Call it before the handler waits on anything
-- else (bytes that came before are the first chunk). nil at the end; the abort error when the
-- client leaves before it.
function Req:body_reader()
    if not is_req(self) then raise("req:body_reader() is a method: call it with a colon") end
    return require("khamsin.stream").body_reader(self)
end

-- The body decoded as JSON (k.json's decoder). A body that is not JSON, or nested deeper than
-- max_depth (default 100) levels, answers 400 with the reason and its path unless the handler
-- catches it.
local json_decode = core.json_decode
local JSON_DEPTH = 100

function Req:json(max_depth)
    if not is_req(self) then raise("req:json() is a method: call it with a colon") end
    if max_depth ~= nil and (type(max_depth) ~= "number" or not (max_depth >= 1 and max_depth <= 1000)) then
        raise("req:json(max_depth): max_depth must be a number from 1 to 1000, got "
            .. (type(max_depth) == "number" and tostring(max_depth) or "a " .. type(max_depth)))
    end
    local v, derr, path = json_decode(self:body(), max_depth or JSON_DEPTH)
    if v == nil then error(errors.http(400, "invalid JSON: " .. derr .. ", at " .. path), 0) end
    return v
end

-- The body as an application/x-www-form-urlencoded form (khamsin.form has the rules): a table
-- of name -> value, or an array of values for a repeated name; 415 for another Content-Type,
-- 400 with the reason for a malformed body or more than max_fields (limit form_fields) fields.
function Req:form(opts)
    if not is_req(self) then raise("req:form() is a method: call it with a colon") end
    if opts ~= nil and (type(opts) ~= "table" or (opts.max_fields ~= nil and
        (type(opts.max_fields) ~= "number" or opts.max_fields < 1 or opts.max_fields % 1 ~= 0))) then
        raise("req:form(opts): opts is a table whose max_fields is a positive integer")
    end
    local cached = rawget(self, "_form")
    if cached then return cached end
    local f = require("khamsin.form").read(self, opts)
    rawset(self, "_form", f)
    return f
end

-- A multipart/form-data body read part by part (khamsin.multipart has the options and rules).
function Req:multipart(opts)
    if not is_req(self) then raise("req:multipart() is a method: call it with a colon") end
    return require("khamsin.multipart").new(self, opts)
end

local req_mt = {
    __index = function(req, key)
        local m = Req[key]
        if m then return m end
        local f = fields[key]
        if f then return f(req) end
        return nil
    end,
}

-- Constant values in the constructor, the real ones stored after: the built-in modules are
-- loaded as bytecode (cmake/kh_lua_bytecode.cmake), and LuaJIT's bytecode writer keeps only the
-- template's keys that have a constant value. `{ _s = s, _g = gen }` from bytecode copies an
-- empty template with no hash part, and each key is then inserted with a rehash (the JIT's
-- NEWREF); with constants, the copy has both slots and the stores fill them
-- (bench/callgrind.sh: 3 rehashes per hello-world request with res, 781 instructions).
-- p: the stream's address as a number, for the FFI accessors (absent: load_head's path).
-- (Slots for method and path too, `method = false` then stored nil, took a handler reading both
-- from 8,645 to 6,600 instructions per request but a hello-world from 5,361 to 5,662: the
-- template that the JIT copies when it cannot sink the table is twice as big.)
function M.new(s, gen, p)
    local req = setmetatable({ _s = false, _g = false, _p = false }, req_mt)
    req._s, req._g, req._p = s, gen, p or false
    return req
end

return M
