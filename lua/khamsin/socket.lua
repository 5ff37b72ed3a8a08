-- khamsin.socket: k.socket, TCP sockets (and TLS on them) whose waits yield the coroutine
-- instead of blocking the worker, with luasocket's methods and return conventions, plus
-- OpenResty's cosocket extras (settimeouts, setkeepalive, sslhandshake, receiveany).
-- Owns: the Lua face of the socket object (its C half is lua/kh_lua_socket.c over core's
-- kh_out) and k.socket.luasocket(), a stand-in for luasocket's `socket` module.
-- Units: each method keeps the units of the library it comes from: settimeout in seconds
-- (luasocket); settimeouts and setkeepalive in milliseconds (OpenResty).
local ok, core = pcall(require, "khamsin.core")
if not ok then
    error("k.socket runs on a worker's loop, not in a k.blocking pool thread (a pool thread "
        .. "may block: use luasocket there, require \"socket\")", 2)
end
local errors = require "khamsin.errors"

local type, error, tostring, tonumber, select = type, error, tostring, tonumber, select
local concat, floor = table.concat, math.floor
local raise = errors.raise
errors.own()

local c_new, c_connect, c_tls = core.socket_new, core.socket_connect, core.socket_tls
local c_send, c_receive = core.socket_send, core.socket_receive
local c_settimeouts, c_setkeepalive = core.socket_settimeouts, core.socket_setkeepalive
local c_close, c_shutdown = core.socket_close, core.socket_shutdown
local c_getpeername, c_setoption, c_info = core.socket_getpeername, core.socket_setoption,
    core.socket_info
local c_readable, c_select = core.socket_readable, core.socket_select

-- st is true (then the values are luasocket's), "aborted" (the request is over: raise so the
-- handler's pcall cleanups run) or "misuse" (raised at the app's line).
local function waited(st, ...)
    if st == true then return ... end
    if st == "aborted" then error(errors.aborted((...)), 0) end
    raise((...))
end

local M = {}
local methods = {}

local SOCK_MT = debug.getregistry()["khamsin.socket"]
SOCK_MT.__index = methods
SOCK_MT.__tostring = function(s) return "tcp{client}: " .. string.format("%p", s) end
-- LuaJIT's %p: fall back to the default when it is missing
if not pcall(string.format, "%p", SOCK_MT) then
    SOCK_MT.__tostring = nil
end

local function check_sock(s, what)
    if getmetatable(s) ~= SOCK_MT then
        raise(what .. ": call it with ':' on a socket from k.socket.tcp()")
    end
end

-- k.socket.tcp() -> a socket, not yet connected.
function M.tcp()
    return waited(c_new())
end

local function tls_opts(what, t)
    if type(t) ~= "table" then
        raise(what .. ": expected a table {server_name=, verify=, alpn=, cafile=}, got a "
            .. type(t))
    end
    local alpn = t.alpn
    if type(alpn) == "table" then alpn = concat(alpn, ",") end
    if alpn ~= nil and type(alpn) ~= "string" then
        raise(what .. ": alpn must be a list of protocol names or a string, got a " .. type(alpn))
    end
    if t.server_name ~= nil and type(t.server_name) ~= "string" then
        raise(what .. ": server_name must be a string, got a " .. type(t.server_name))
    end
    if t.cafile ~= nil and type(t.cafile) ~= "string" then
        raise(what .. ": cafile must be a path, got a " .. type(t.cafile))
    end
    return { server_name = t.server_name, verify = t.verify ~= false, alpn = alpn,
        cafile = t.cafile }
end

-- sock:connect(host, port [, {pool=, deny_private=, tls={...}}]) -> 1 | nil, err
-- A connection parked with setkeepalive for the same host, port (and TLS settings) is taken
-- from the worker's pool instead of a new one (sock:getreusedtimes() > 0).
-- opts.pool_size caps the connections to this host and port (pooled ones included): a connect
-- beyond it waits (up to the connect timeout) for one to be parked or closed, if fewer than
-- opts.backlog already wait; else nil, "too many waiting connections ...".
local defaults = setmetatable({}, { __mode = "k" }) -- socket -> connect options (luasocket{})

function methods.connect(s, host, port, opts)
    check_sock(s, "sock:connect")
    if opts == nil then opts = defaults[s] end
    if type(host) ~= "string" then
        raise("sock:connect(host, port): host must be a string, got a " .. type(host))
    end
    local p = tonumber(port)
    if not p or p % 1 ~= 0 or p < 1 or p > 65535 then
        raise("sock:connect(host, port): port must be an integer from 1 to 65535, got "
            .. tostring(port))
    end
    local o
    if opts ~= nil then
        if type(opts) ~= "table" then
            raise("sock:connect(host, port, opts): opts must be a table, got a " .. type(opts))
        end
        for _, f in ipairs { "pool_size", "backlog" } do
            local v = opts[f]
            if v ~= nil and (type(v) ~= "number" or v < 0 or v % 1 ~= 0) then
                raise("sock:connect(host, port, opts): opts." .. f .. " must be a whole number, "
                    .. "got " .. tostring(v))
            end
        end
        o = { pool = opts.pool, deny_private = opts.deny_private and true or false,
            pool_size = opts.pool_size, backlog = opts.backlog or 0 }
        if opts.tls then o.tls = tls_opts("sock:connect: opts.tls", opts.tls) end
    end
    return waited(c_connect(s, host, p, o))
end

-- sock:tls{server_name=, verify=true, alpn={"h2", "http/1.1"}, cafile=} -> 1 | nil, err
-- Certificates are checked against the system store (or cafile) and server_name by default.
function methods.tls(s, t)
    check_sock(s, "sock:tls")
    return waited(c_tls(s, tls_opts("sock:tls", t or {})))
end

-- OpenResty's sslhandshake(reused_session, server_name, verify): true | nil, err.
-- verify defaults to true here (OpenResty: false): pass false to skip the check.
function methods.sslhandshake(s, _, server_name, verify)
    check_sock(s, "sock:sslhandshake")
    local r, err = waited(c_tls(s, tls_opts("sock:sslhandshake",
        { server_name = server_name, verify = verify })))
    if not r then return nil, err end
    return true
end

-- The protocol ALPN chose ("h2", "http/1.1") or nil.
function methods.alpn(s)
    check_sock(s, "sock:alpn")
    local a = c_info(s).alpn
    return a ~= "" and a or nil
end

function methods.getreusedtimes(s)
    check_sock(s, "sock:getreusedtimes")
    return c_info(s).reused
end

-- sock:send(data [, i [, j]]) -> last index sent | nil, err, last index sent
function methods.send(s, data, i, j)
    check_sock(s, "sock:send")
    local t = type(data)
    if t == "number" then
        data = tostring(data)
    elseif t == "table" then
        data = concat(data) -- OpenResty accepts a table of strings
    elseif t ~= "string" then
        raise("sock:send(data): data must be a string, got a " .. t)
    end
    return waited(c_send(s, data, i, j))
end

-- sock:receive(pattern [, prefix]): "*l" (default: a line, CR and LF removed), "*a" (until
-- the peer closes), or a number of bytes. -> data | nil, err, partial
function methods.receive(s, pattern, prefix)
    check_sock(s, "sock:receive")
    if prefix ~= nil and type(prefix) ~= "string" then
        raise("sock:receive(pattern, prefix): prefix must be a string, got a " .. type(prefix))
    end
    pattern = pattern or "*l"
    if type(pattern) == "number" then
        if pattern < 0 or pattern % 1 ~= 0 then
            raise("sock:receive(n): n must be a whole number, got " .. pattern)
        end
        if pattern == 0 then return prefix or "" end
        return waited(c_receive(s, "n", pattern, prefix))
    end
    if pattern == "*l" or pattern == "l" then
        return waited(c_receive(s, "l", 0, prefix))
    elseif pattern == "*a" or pattern == "a" then
        return waited(c_receive(s, "a", 0, prefix))
    end
    raise("sock:receive(pattern): pattern must be \"*l\", \"*a\" or a number, got "
        .. tostring(pattern))
end

-- OpenResty's receiveany(max): whatever has arrived (at least 1 byte, at most max).
function methods.receiveany(s, max)
    check_sock(s, "sock:receiveany")
    if type(max) ~= "number" or max < 1 then
        raise("sock:receiveany(max): max must be a number above 0, got " .. tostring(max))
    end
    return waited(c_receive(s, "s", floor(max)))
end

local function seconds(what, v)
    if v == nil then return -1 end
    if type(v) ~= "number" then raise(what .. ": expected a number, got a " .. type(v)) end
    return v
end

-- socket -> {block, total} of luasocket's settimeout (seconds, -1: none)
local tmodes = setmetatable({}, { __mode = "k" })

-- luasocket's settimeout(seconds [, mode]) (nil or < 0: no timeout). Mode "b" (block, the
-- default): how long one operation may wait; "t" (total; "r" too, as in luasocket): how long
-- a call may take. A call here is one wait, so each call waits at most the smaller of the two.
function methods.settimeout(s, v, mode)
    check_sock(s, "sock:settimeout")
    v = seconds("sock:settimeout(seconds)", v)
    mode = mode or "b"
    if type(mode) ~= "string" then
        raise("sock:settimeout(seconds, mode): mode must be \"b\" or \"t\", got a " .. type(mode))
    end
    local m = tmodes[s]
    if not m then
        m = { -1, -1 }
        tmodes[s] = m
    end
    local c = mode:sub(1, 1)
    if c == "b" then
        m[1] = v < 0 and -1 or v
    elseif c == "t" or c == "r" then
        m[2] = v < 0 and -1 or v
    else
        raise("sock:settimeout(seconds, mode): invalid timeout mode \"" .. mode
            .. "\" (\"b\" or \"t\")")
    end
    local b, t = m[1], m[2]
    local e = b < 0 and t or (t < 0 and b or (b < t and b or t))
    c_settimeouts(s, e, e, e)
    return 1
end

-- OpenResty's settimeouts(connect_ms, send_ms, read_ms); nil keeps one as it is.
function methods.settimeouts(s, c, w, r)
    check_sock(s, "sock:settimeouts")
    local function ms(x, what)
        if x == nil then return nil end
        if type(x) ~= "number" then
            raise("sock:settimeouts(connect_ms, send_ms, read_ms): " .. what
                .. " must be a number of milliseconds, got a " .. type(x))
        end
        return x / 1000
    end
    c_settimeouts(s, ms(c, "connect_ms"), ms(w, "send_ms"), ms(r, "read_ms"))
    return 1
end

-- OpenResty's setkeepalive(idle_ms, pool_size): parks the connection in the worker's pool
-- (idle_ms 0: no idle limit; defaults: socket_keepalive_ms and socket_pool_size). The socket
-- object is then closed; connect() again takes a pooled connection.
function methods.setkeepalive(s, idle_ms, size)
    check_sock(s, "sock:setkeepalive")
    if idle_ms ~= nil and (type(idle_ms) ~= "number" or idle_ms < 0) then
        raise("sock:setkeepalive(idle_ms, pool_size): idle_ms must be a number >= 0, got "
            .. tostring(idle_ms))
    end
    if size ~= nil and (type(size) ~= "number" or size < 0 or size % 1 ~= 0) then
        raise("sock:setkeepalive(idle_ms, pool_size): pool_size must be a whole number, got "
            .. tostring(size))
    end
    if size == nil and defaults[s] then size = defaults[s].pool_size end
    return c_setkeepalive(s, idle_ms and idle_ms / 1000, size)
end

function methods.close(s)
    check_sock(s, "sock:close")
    return c_close(s)
end

-- Half-close (FIN). luasocket's mode argument ("both", "send", "receive") is accepted; only
-- the sending side is shut.
function methods.shutdown(s)
    check_sock(s, "sock:shutdown")
    return c_shutdown(s)
end

function methods.getpeername(s)
    check_sock(s, "sock:getpeername")
    return c_getpeername(s)
end

-- setoption("tcp-nodelay" | "keepalive", boolean) -> 1 | nil, err
function methods.setoption(s, name, value)
    check_sock(s, "sock:setoption")
    if type(name) ~= "string" then
        raise("sock:setoption(name, value): name must be a string, got a " .. type(name))
    end
    return c_setoption(s, name, value)
end

-- Counters of this worker's outbound sockets (see kh_out.h's kh_out_stats).
function M.stats()
    return core.socket_stats()
end

-- A table that stands in for luasocket's `socket` module:
--   package.loaded.socket = k.socket.luasocket()
-- so libraries written for luasocket (redis-lua, ...) use k.socket inside handlers.
-- opts (optional): the connect options every socket made through it gets, e.g.
-- { pool_size = 20, backlog = 1000 } so that a library that only calls connect(host, port)
-- shares at most 20 connections per worker and host (setkeepalive() then keeps as many).
function M.luasocket(opts)
    if opts ~= nil and type(opts) ~= "table" then
        raise("k.socket.luasocket(opts): opts must be a table of connect options, got a "
            .. type(opts))
    end
    local S = { _VERSION = "LuaSocket 3.0-rc1 (khamsin k.socket)", _M = nil }
    S.tcp = function()
        local s = M.tcp()
        defaults[s] = opts
        return s
    end
    S.tcp4, S.tcp6 = S.tcp, S.tcp
    function S.connect(host, port)
        local s = S.tcp()
        local r, err = s:connect(host, port)
        if not r then return nil, err end
        return s
    end
    S.connect4, S.connect6 = S.connect, S.connect
    function S.gettime()
        return core.socket_gettime()
    end
    function S.sleep(sec)
        if type(sec) ~= "number" or sec < 0 then return end
        waited(core.sleep(sec))
    end
    -- select(recvt, sendt, timeout) -> readable, writable, err: luasocket's, with each list
    -- holding its sockets both as an array and as keys (r[1] == s and r[s] == true).
    -- Readable: input is buffered, or the peer closed (a receive answers at once). Writable:
    -- every open socket (a send queues its bytes; it waits only while the kernel takes them).
    -- Closed sockets and values that are not k.socket sockets are skipped, as luasocket skips
    -- closed ones. When none is ready, the coroutine waits (never the worker) on all the
    -- readable candidates at once, up to timeout (nil or < 0: no limit; 0: just look); err is
    -- "timeout" when nothing became ready.
    function S.select(recvt, sendt, timeout)
        if timeout ~= nil and type(timeout) ~= "number" then
            raise("socket.select(recvt, sendt, timeout): timeout must be a number, got a "
                .. type(timeout))
        end
        local r, w = {}, {}
        if sendt then
            for i = 1, #sendt do
                local s = sendt[i]
                if getmetatable(s) == SOCK_MT and c_readable(s) ~= nil and not w[s] then
                    w[#w + 1] = s
                    w[s] = true
                end
            end
        end
        local cand, seen = {}, {}
        if recvt then
            for i = 1, #recvt do
                local s = recvt[i]
                if getmetatable(s) == SOCK_MT and not seen[s] then
                    seen[s] = true
                    local st = c_readable(s)
                    if st then
                        r[#r + 1] = s
                        r[s] = true
                    elseif st == false then
                        cand[#cand + 1] = s
                    end
                end
            end
        end
        if #r > 0 or #w > 0 then return r, w, nil end
        if timeout == 0 then return r, w, "timeout" end
        if #cand == 0 then
            if timeout and timeout > 0 then S.sleep(timeout) end
            return r, w, "timeout"
        end
        waited(c_select(timeout or -1, unpack(cand))) -- "ready" | "timeout"
        for i = 1, #cand do
            local s = cand[i]
            if c_readable(s) then
                r[#r + 1] = s
                r[s] = true
            end
        end
        if #r == 0 then return r, w, "timeout" end -- st == "timeout"
        return r, w, nil
    end
    function S.newtry(finalizer)
        return function(...)
            if not (...) then
                if finalizer then pcall(finalizer) end
                error({ (select(2, ...)) }, 0)
            end
            return ...
        end
    end
    function S.protect(f)
        return function(...)
            local res = { pcall(f, ...) }
            if res[1] then return unpack(res, 2, table.maxn(res)) end
            local e = res[2]
            if type(e) == "table" and not errors.is_aborted(e) then return nil, e[1] end
            error(e, 0)
        end
    end
    S.try = S.newtry()
    function S.skip(d, ...) return select(d + 1, ...) end
    S.dns = {
        toip = function(name)
            local ip, err = M.resolve(name)
            if not ip then return nil, err end
            return ip[1], { name = name, alias = {}, ip = ip }
        end,
        getaddrinfo = function(name)
            local ip, err = M.resolve(name)
            if not ip then return nil, err end
            local t = {}
            for i, a in ipairs(ip) do
                t[i] = { family = a:find(":", 1, true) and "inet6" or "inet", addr = a }
            end
            return t
        end,
        gethostname = function()
            local f = io.open("/proc/sys/kernel/hostname")
            local h = f and f:read("*l")
            if f then f:close() end
            return h
        end,
    }
    S.dns.tohostname = function(addr) return nil, "not supported by k.socket" end
    return S
end

-- k.socket.tls_preload{cafile=, verify=}: loads the TLS module and the CA store now (call it
-- while the script loads) instead of in the first TLS connection's slice. true | nil, err
function M.tls_preload(opts)
    if opts ~= nil and type(opts) ~= "table" then
        raise("k.socket.tls_preload(opts): opts must be a table {cafile=, verify=}, got a "
            .. type(opts))
    end
    opts = opts or {}
    return core.socket_tls_preload(opts.cafile, opts.verify ~= false)
end

-- k.socket.resolve(host) -> {ip, ...} | nil, err (yields; the worker's DNS cache first)
function M.resolve(host)
    if type(host) ~= "string" then
        raise("k.socket.resolve(host): host must be a string, got a " .. type(host))
    end
    return waited(core.socket_resolve(host))
end

return M
