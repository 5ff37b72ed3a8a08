-- khamsin.http: k.http, an HTTP client whose waits yield the coroutine (never the worker).
-- Owns: the request flow (URL, redirects, timeouts as deadlines, retries of an idempotent request
-- whose pooled connection the server had closed or of a stream a GOAWAY excluded,
-- Content-Encoding decoding, streamed request bodies, the response object) and, per worker, the
-- list of shared HTTP/2 connections of each origin (khamsin.http.h2 userdata, kh_out_h2 in core:
-- concurrent requests are streams of one of them) and the origins that chose http/1.1 by ALPN.
-- In: k.http.request / k.http.get from handlers, timers, subscribers.
-- Out: res {status, reason, headers (case-insensitive), body, version, url} and res:reader();
-- or nil, reason on any network or protocol failure (never raises for those).
-- Never: parses or writes HTTP itself: every byte goes through the C codecs (core's
-- kh_h1_client, kh_h2_client, kh_http_decode via lua/kh_lua_http.c); holds a streamed request
-- body (one piece at a time: sent, or under HTTP/2 held back by flow control up to H2_HIGH,
-- before the next is pulled). HTTP/1.1 connects, TLS, the keep-alive pool, timeouts and the abort
-- of a request that the client left are k.socket's; an HTTP/2 connection is connected by
-- k.socket, then its I/O is kh_out_h2's, and an abort resets only the stream (kh_lua_http.c).
local ok, core = pcall(require, "khamsin.core")
if not ok then
    error("k.http runs on a worker's loop, not in a k.blocking pool thread", 2)
end
local errors = require "khamsin.errors"
require "khamsin.socket" -- the socket methods (the h2 path uses them)

local type, tostring, tonumber, pairs, ipairs, setmetatable, getmetatable, rawget =
    type, tostring, tonumber, pairs, ipairs, setmetatable, getmetatable, rawget
local concat, lower, floor, min, remove = table.concat, string.lower, math.floor, math.min,
    table.remove
local raise = errors.raise
errors.own()

local now = core.now
local LIM = core.http_limits
local h1_request, h1_reader, h1_feed, h1_eof, h1_started, h1_reset = core.http_h1_request,
    core.http_h1_reader, core.http_h1_feed, core.http_h1_eof, core.http_h1_started,
    core.http_h1_reset
-- k.socket's raw functions (lua/kh_lua_socket.c): the h1 path calls them without the argument
-- checks of khamsin/socket.lua's methods, which it would pass every time
local c_new, c_connect, c_send, c_receive, c_settimeouts, c_setkeepalive, c_close, c_reused =
    core.socket_new, core.socket_connect, core.socket_send, core.socket_receive,
    core.socket_settimeouts, core.socket_setkeepalive, core.socket_close, core.socket_reused
local decoder, decode, decode_finish = core.http_decoder, core.http_decode,
    core.http_decode_finish
local h2_new, h2_attach, h2_fail, h2_submit, h2_write, h2_wait, h2_info, h2_take, h2_forget,
    h2_forget_later, h2_state = core.http_h2_new, core.http_h2_attach, core.http_h2_fail,
    core.http_h2_submit, core.http_h2_write, core.http_h2_wait, core.http_h2_info,
    core.http_h2_take, core.http_h2_forget, core.http_h2_forget_later, core.http_h2_state
local newproxy = newproxy

local M = {}

-- a raw socket function's results: true, values... | "aborted", why | "misuse", message
local function waited(st, ...)
    if st == true then return ... end
    if st == "aborted" then error(errors.aborted((...)), 0) end
    raise((...))
end

-- response readers are reused (each holds a field array and a buffer)
local free_readers, nfree = {}, 0
local function get_reader(head_request, max_body)
    if nfree > 0 then
        local r = free_readers[nfree]
        free_readers[nfree] = nil
        nfree = nfree - 1
        h1_reset(r, head_request, max_body)
        return r
    end
    return h1_reader(head_request, LIM.http_client_header_bytes, LIM.http_client_header_fields,
        max_body)
end
local function put_reader(r)
    if nfree < 64 then
        nfree = nfree + 1
        free_readers[nfree] = r
    end
end

-- socket objects are reused too, once their connection went back to the pool or closed: a
-- userdata with a __gc per request costs the collector more than the request's other garbage
local free_socks, nsocks = {}, 0
local function get_sock()
    if nsocks > 0 then
        local s = free_socks[nsocks]
        free_socks[nsocks] = nil
        nsocks = nsocks - 1
        return s
    end
    return waited(c_new())
end
local function put_sock(s)
    if nsocks < 64 then
        nsocks = nsocks + 1
        free_socks[nsocks] = s
    end
end

local READ_CHUNK = 65536
local CHUNKED = -2 -- h1_request's body length for Transfer-Encoding: chunked
local format = string.format
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true,
    TRACE = true }
local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }
-- credentials that never follow a redirect to another origin
local CREDENTIALS = { authorization = true, cookie = true, ["proxy-authorization"] = true }

-- ---- URLs ----

-- "scheme://host[:port]/path?query" -> {scheme, host, port, target, authority} | nil, reason
local function parse_url(url)
    local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
    if not scheme then return nil, "invalid url: " .. url end
    scheme = lower(scheme)
    if scheme ~= "http" and scheme ~= "https" then
        return nil, "unsupported url scheme: " .. scheme
    end
    local auth, target = rest:match("^([^/?#]*)(.*)$")
    target = target:gsub("#.*$", "")
    if target == "" then
        target = "/"
    elseif target:sub(1, 1) == "?" then
        target = "/" .. target
    end
    if auth:find("@", 1, true) then return nil, "invalid url: user info is not supported" end
    local host, port
    if auth:sub(1, 1) == "[" then
        host, port = auth:match("^(%[[%x:.]+%])(.*)$")
    else
        host, port = auth:match("^([^:]*)(.*)$")
    end
    if not host or host == "" then return nil, "invalid url: no host in " .. url end
    if port ~= "" then
        port = port:match("^:(%d+)$")
        port = tonumber(port)
        if not port or port < 1 or port > 65535 then return nil, "invalid url: bad port" end
    else
        port = nil
    end
    local default = scheme == "https" and 443 or 80
    local authority = lower(host)
    if port and port ~= default then authority = authority .. ":" .. port end
    return { scheme = scheme, host = lower(host), port = port or default, target = target,
        authority = authority, url = url }
end

-- parsed URLs of recent requests (most requests of a service go to a few URLs); reset when big
local url_cache, url_cached = {}, 0
local function parse_url_cached(url)
    local u = url_cache[url]
    if u then return u end
    local err
    u, err = parse_url(url)
    if not u then return nil, err end
    if url_cached >= 256 then url_cache, url_cached = {}, 0 end
    url_cache[url] = u
    url_cached = url_cached + 1
    return u
end

-- Location relative to the current URL (RFC 3986 §5.2, the forms servers use)
local function resolve(base, loc)
    if loc:match("^%a[%w+.-]*://") then return loc end
    local origin = base.scheme .. "://" .. base.authority
    if loc:sub(1, 2) == "//" then return base.scheme .. ":" .. loc end
    if loc:sub(1, 1) == "/" then return origin .. loc end
    local dir = base.target:gsub("[?#].*$", ""):gsub("[^/]*$", "")
    if loc:sub(1, 1) == "?" then return origin .. base.target:gsub("%?.*$", "") .. loc end
    return origin .. dir .. loc
end

local function same_origin(a, b)
    return a.scheme == b.scheme and a.host == b.host and a.port == b.port
end

-- ---- headers ----

local header_mt = {
    __index = function(t, k)
        if type(k) == "string" then return rawget(t, lower(k)) end
    end,
}

-- fields {n1, v1, ...} -> case-insensitive table (repeated fields joined with ", ")
local function header_table(fields)
    local h = setmetatable({}, header_mt)
    for i = 1, #fields, 2 do
        local n = lower(fields[i])
        local old = rawget(h, n)
        h[n] = old and (old .. ", " .. fields[i + 1]) or fields[i + 1]
    end
    return h
end

-- the user's headers -> flat list; drops credentials when asked
local function flat_headers(hdrs, drop_credentials)
    local out, seen = {}, {}
    if hdrs then
        for name, v in pairs(hdrs) do
            if type(name) ~= "string" then
                raise("k.http.request: header names must be strings, got a " .. type(name))
            end
            local ln = lower(name)
            if not (drop_credentials and CREDENTIALS[ln]) then
                seen[ln] = true
                if type(v) == "table" then
                    for _, x in ipairs(v) do
                        out[#out + 1] = name
                        out[#out + 1] = tostring(x)
                    end
                else
                    out[#out + 1] = name
                    out[#out + 1] = tostring(v)
                end
            end
        end
    end
    return out, seen
end

-- ---- timeouts ----

local function remaining_ms(o)
    return (o.deadline - now()) * 1000
end

local function arm(sock, o, phase_ms)
    local left = remaining_ms(o)
    if left <= 0 then return nil end
    local t = min(left, phase_ms or left)
    sock:settimeouts(o.connect_ms and min(o.connect_ms, left) or left, t, t)
    return true
end

-- ---- the response body, shared by h1 and h2 ----

local res_methods = {}
local res_mt = { __index = res_methods }

-- res:reader() -> a function giving the next chunk of the body, then nil at the end (or nil,
-- reason on a failure). Without stream=true the body is already in res.body: one chunk.
function res_methods.reader(res)
    if type(res) ~= "table" or getmetatable(res) ~= res_mt then
        raise("res:reader(): call it with ':' on a response from k.http")
    end
    if res._next then
        local nx = res._next
        res._next = nil
        return nx
    end
    local body = res.body
    return function()
        local b = body
        body = nil
        if b == "" then return nil end
        return b
    end
end

-- wraps a raw chunk source with the decoder of Content-Encoding (if any)
local function decoding(raw, dec)
    if not dec then return raw end
    local done = false
    return function()
        while not done do
            local chunk, err = raw()
            if chunk == nil then
                if err then return nil, err end
                done = true
                local ok2, derr = decode_finish(dec)
                if not ok2 then return nil, derr end
                return nil
            end
            local out, derr = decode(dec, chunk)
            if not out then return nil, derr end
            if out ~= "" then return out end
        end
        return nil
    end
end

local function drain(nx, max)
    local first, ferr = nx()
    if first == nil then
        if ferr then return nil, ferr end
        return ""
    end
    if #first > max then return nil, "response body too large" end
    local second, serr = nx()
    if second == nil then -- the common case: the whole body in one piece
        if serr then return nil, serr end
        return first
    end
    local parts, n = { first, second }, #first + #second
    if n > max then return nil, "response body too large" end
    while true do
        local c, err = nx()
        if c == nil then
            if err then return nil, err end
            return concat(parts)
        end
        n = n + #c
        if n > max then return nil, "response body too large" end
        parts[#parts + 1] = c
    end
end

-- ---- HTTP/1.1 ----

-- the read timeout for the next read (seconds): read_timeout within what is left of the whole
local function read_s(o)
    local left = o.deadline - now()
    if left <= 0 then return nil end
    local r = o.read_ms and o.read_ms / 1000 or left
    return r < left and r or left
end

-- Before a send: the socket's send and read timeouts set to what is left of the call (read_s);
-- false when the deadline has passed. o.rw_s is what the socket has now (once() set them): while
-- the loop's time has not moved (nothing yielded since), read_s gives the same value and the
-- call would only set them again.
local function arm_send(sock, o)
    local t = read_s(o)
    if not t then return false end
    if t ~= o.rw_s then
        c_settimeouts(sock, nil, t, t)
        o.rw_s = t
    end
    return true
end

-- The connection after a response: back to the pool when it can be reused, else closed; the
-- socket object then serves another request.
local function h1_release(sock, o, reusable, leftover)
    if reusable and leftover == 0 then
        c_setkeepalive(sock, o.keepalive_ms / 1000, o.pool_size)
    else
        c_close(sock)
    end
    put_sock(sock)
end

-- a streamed request body (o.body_src): chunked, or raw under the caller's Content-Length; each
-- piece is sent before the next is pulled, so the upload holds one piece at a time
local function h1_upload(sock, o)
    local src, cl, sent = o.body_src, o.body_len, 0
    while true do
        local okc, chunk = pcall(src)
        if not okc then
            c_close(sock)
            error(chunk, 0)
        end
        if chunk == nil then break end
        if type(chunk) ~= "string" then
            c_close(sock)
            raise("k.http.request: the body function returned a " .. type(chunk)
                .. " (it gives strings, then nil at the end)")
        end
        o.body_pulled = true
        local n = #chunk
        if n > 0 then
            sent = sent + n
            if cl and sent > cl then return nil, "request body longer than its Content-Length" end
            if not arm_send(sock, o) then return nil, "timeout" end
            local okw, werr = waited(c_send(sock, cl and chunk
                or (format("%x\r\n", n) .. chunk .. "\r\n")))
            if not okw then return nil, werr end
        end
    end
    if cl then
        if sent ~= cl then return nil, "request body shorter than its Content-Length" end
        return true
    end
    if not arm_send(sock, o) then return nil, "timeout" end
    local okw, werr = waited(c_send(sock, "0\r\n\r\n"))
    if not okw then return nil, werr end
    return true
end

-- -> status, headers, reason, version, body (the whole body when it came with the head), nx
-- (the body's chunk source otherwise) | nil, err, retry
local function h1_exchange(sock, o, u)
    local body, src = o.body, o.body_src
    local blen = body and #body or nil
    if src then blen = o.body_len or CHUNKED end
    local req, rerr = h1_request(o.method, u.target, u.authority, o.fields, blen)
    if not req then
        c_close(sock)
        raise("k.http.request: " .. rerr)
    end
    if not arm_send(sock, o) then return nil, "timeout" end
    local okw, werr = waited(c_send(sock, body and #body < 65536 and (req .. body) or req))
    if okw and body and #body >= 65536 then okw, werr = waited(c_send(sock, body)) end
    if not okw then return nil, werr, not o.body_pulled end
    if src then
        okw, werr = h1_upload(sock, o)
        if not okw then return nil, werr, not o.body_pulled end
    end
    local r = get_reader(o.method == "HEAD", o.max_body)
    local status, headers, reason, minor
    local pending, done, reusable, leftover = "", false, false, 0
    -- reads until the head arrives (body bytes that came with it wait in pending)
    while not status do
        local t = read_s(o)
        if not t then return nil, "timeout" end
        if t ~= o.rw_s then
            c_settimeouts(sock, nil, nil, t)
            o.rw_s = false -- the send timeout is another now
        end
        local data, err = waited(c_receive(sock, "s", READ_CHUNK))
        if not data then
            if err == "closed" then
                local started = h1_started(r)
                local _, eerr = h1_eof(r)
                return nil, eerr, not started and not o.body_pulled
            end
            return nil, err
        end
        local st, bd, dn, ferr, ru, lo, hd, rs, mi = h1_feed(r, data)
        if ferr then return nil, ferr end
        status, headers, reason, minor = st, hd, rs, mi
        pending, done, reusable, leftover = bd, dn, ru, lo
    end
    setmetatable(headers, header_mt)
    local version = minor == 0 and "1.0" or "1.1"
    if done then
        -- the usual case: the whole response came with the head (no closures, no chunk source)
        put_reader(r)
        h1_release(sock, o, reusable, leftover)
        return status, headers, reason, version, pending
    end
    local np = pending ~= "" and 1 or 0
    local finished = false
    local function finish()
        if finished then return end
        finished = true
        put_reader(r)
        h1_release(sock, o, reusable, leftover)
    end
    local function fail(err)
        finished = true
        c_close(sock)
        return nil, err
    end
    local function raw()
        if np > 0 then
            np = 0
            local c = pending
            pending = nil
            return c
        end
        while not done do
            local tt = read_s(o)
            if not tt then return fail("timeout") end
            c_settimeouts(sock, nil, nil, tt)
            local data, err = waited(c_receive(sock, "s", READ_CHUNK))
            if not data then
                if err ~= "closed" then return fail(err) end
                local eok, eerr = h1_eof(r)
                if not eok then return fail(eerr) end
                done, reusable = true, false
                break
            end
            local _, bd, dn, ferr, ru, lo = h1_feed(r, data)
            if ferr then return fail(ferr) end
            done, reusable, leftover = dn, ru, lo
            if bd ~= "" then return bd end
        end
        finish()
        return nil
    end
    return status, headers, reason, version, nil, raw
end

-- ---- HTTP/2 (over TLS when the server picks it by ALPN, or h2c with prior knowledge) ----
-- Per worker and origin, shared connections (lua/kh_lua_http.c over core/kh_out_h2): every
-- request to the origin is a stream of one of them, each coroutine waiting on its own stream
-- with its own timeouts, while the connection object does the I/O for all. A connection is
-- listed as soon as it starts connecting, so concurrent requests queue on it instead of
-- opening their own; a second one opens only when the server's SETTINGS_MAX_CONCURRENT_STREAMS
-- is reached on every listed one.

local h2_conns = {}  -- origin key -> list of connections
local h1_origin = {} -- origin key -> true: the server chose http/1.1 by ALPN (not asked again)
local WAIT_HEAD, WAIT_BODY, WAIT_DRAIN = 1, 2, 3
local H2_HIGH = 65536 -- upload bytes held back by flow control before the uploader waits
local NOT_H2 = "http/2 not negotiated"

local function h2_pick(key)
    local list = h2_conns[key]
    if not list then return nil end
    local i = 1
    while i <= #list do
        local conn = list[i]
        local can, _, dead = h2_state(conn)
        if dead then
            remove(list, i)
        else
            if can then return conn end
            i = i + 1
        end
    end
end

local function h2_unlist(key, conn)
    local list = h2_conns[key]
    if not list then return end
    for i = #list, 1, -1 do
        if list[i] == conn then remove(list, i) end
    end
end

-- waits on stream id for `what` under the request's deadline and the phase's timeout
local function h2_await(conn, id, what, o, low)
    local left = remaining_ms(o)
    if left <= 0 then return nil, "timeout" end
    local phase = what == WAIT_DRAIN and o.send_ms or o.read_ms
    local t = phase and min(phase, left) or left
    return waited(h2_wait(conn, id, what, low or 0, t / 1000))
end

-- a streamed request body as DATA frames: more is pulled only while what flow control holds
-- back stays under H2_HIGH
local function h2_upload(conn, id, o)
    local src, cl, sent = o.body_src, o.body_len, 0
    while true do
        local okc, chunk = pcall(src)
        if not okc then
            h2_forget(conn, id)
            error(chunk, 0)
        end
        if chunk ~= nil and type(chunk) ~= "string" then
            h2_forget(conn, id)
            raise("k.http.request: the body function returned a " .. type(chunk)
                .. " (it gives strings, then nil at the end)")
        end
        o.body_pulled = true
        local fin = chunk == nil
        chunk = chunk or ""
        sent = sent + #chunk
        if cl and (sent > cl or (fin and sent ~= cl)) then
            return nil, "request body length differs from its Content-Length"
        end
        local unsent, werr = h2_write(conn, id, chunk, fin)
        if not unsent then return nil, werr end
        if fin then return true end
        if unsent > H2_HIGH then
            local ok2, err = h2_await(conn, id, WAIT_DRAIN, o, H2_HIGH)
            if not ok2 then return nil, err end
            local _, dn, serr = h2_info(conn, id, false)
            if serr then return nil, serr end
            if dn then return true end -- the server answered in full: it wants no more
        end
    end
end

-- one request as a stream of conn -> head, body source | nil, err, retry (retry: the server
-- did not process it, or conn turned out not to be HTTP/2)
local function h2_exchange(conn, o, u)
    -- the same refusals as over HTTP/1.1 (CR/LF or control bytes in a field, a bad method or
    -- target): HPACK would carry them, the next HTTP/1.1 hop would not
    local okr, rerr = h1_request(o.method, u.target, u.authority, o.fields, nil)
    if not okr then raise("k.http.request: " .. rerr) end
    local body = o.body
    if o.body_src then body = false end
    local id, serr = h2_submit(conn, o.method, u.scheme, u.authority, u.target, o.fields, body,
        o.body_len)
    if not id then return nil, serr, true end
    if o.body_src then
        local ok2, uerr = h2_upload(conn, id, o)
        if not ok2 then
            local _, _, serr2 = h2_info(conn, id, false)
            h2_forget(conn, id)
            local e = serr2 or uerr
            return nil, e, e == NOT_H2 or (not o.body_pulled and e:find("going away", 1, true))
        end
    end
    local status, fields
    while true do
        local st, _, err, flds = h2_info(conn, id, true)
        if err then
            h2_forget(conn, id)
            -- a GOAWAY that excluded it, or a connection that was never HTTP/2: not processed
            -- a connection the server closed before it answered: an idempotent request may go
            -- again on another one
            local retry = err == NOT_H2 or (not o.body_pulled and (err:find("going away", 1, true)
                or (err == "closed mid-body" and IDEMPOTENT[o.method])))
            return nil, err == "closed mid-body" and "closed" or err, retry
        end
        if st ~= 0 then
            status, fields = st, flds
            break
        end
        local ok2, werr = h2_await(conn, id, WAIT_HEAD, o)
        if not ok2 then
            h2_forget(conn, id) -- RST_STREAM CANCEL: this stream only
            return nil, werr
        end
    end
    local finished = false
    -- a response dropped before its end (stream = true, read in part; or its coroutine aborted
    -- between two reads): the stream is reset when the reader is collected, so it holds no
    -- window and no slot of the shared connection
    local guard = newproxy(true)
    getmetatable(guard).__gc = function() h2_forget_later(conn, id) end
    local function raw()
        if finished or not guard then return nil end
        while true do
            local chunk = h2_take(conn, id)
            if chunk ~= "" then return chunk end
            local _, dn, err = h2_info(conn, id, false)
            if err or dn then
                finished = true
                h2_forget(conn, id)
                if err then return nil, err end
                return nil
            end
            local ok2, werr = h2_await(conn, id, WAIT_BODY, o)
            if not ok2 then
                finished = true
                h2_forget(conn, id)
                return nil, werr
            end
        end
    end
    return { status = status, reason = "", fields = fields, version = "2" }, raw
end

-- a new connection for key, listed at once (requests that come meanwhile queue on it), then
-- connected -> conn | nil, err | false, sock (the server chose http/1.1: sock is for h1)
local function h2_open(o, u, key)
    -- the connection's receive window covers 100 stream windows, so that a few streams whose
    -- readers are slow cannot stall the others (each stream stays bounded by its own window)
    local conn = h2_new(LIM.h2_stream_window,
        min(2 ^ 31 - 1, math.max(LIM.h2_conn_window, LIM.h2_stream_window * 100)),
        LIM.http_client_header_bytes, LIM.http_client_header_fields, 2 ^ 52,
        LIM.socket_send_timeout_ms, o.keepalive_ms)
    local list = h2_conns[key]
    if not list then
        list = {}
        h2_conns[key] = list
    end
    list[#list + 1] = conn
    local sock = waited(c_new())
    local left = remaining_ms(o)
    if left <= 0 then
        h2_unlist(key, conn)
        h2_fail(conn, "timeout")
        return nil, "timeout"
    end
    left = left / 1000
    local ct = o.connect_ms and o.connect_ms / 1000 or left
    c_settimeouts(sock, ct < left and ct or left, left, left)
    local copts = { deny_private = o.deny_private, pool_size = nil, backlog = 0, pool = key }
    if u.scheme == "https" then
        copts.tls = { server_name = u.host:gsub("^%[(.*)%]$", "%1"), verify = o.verify,
            cafile = o.cafile, alpn = "h2,http/1.1" }
        copts.pool = key .. "#h2,h1" -- never k.socket's pool: a key of its own all the same
    end
    -- the requests queued on conn wait for this connect: if this coroutine is aborted, they
    -- must still hear of it
    local okc, cok, cerr = pcall(waited, c_connect(sock, u.host, u.port, copts))
    if not okc then
        h2_unlist(key, conn)
        h2_fail(conn, "closed")
        c_close(sock)
        error(cok, 0)
    end
    if not cok then
        c_close(sock)
        h2_unlist(key, conn)
        h2_fail(conn, cerr)
        return nil, cerr
    end
    local _, alpn = c_reused(sock)
    if u.scheme == "https" and alpn ~= "h2" then
        h1_origin[key] = true
        h2_unlist(key, conn)
        h2_fail(conn, NOT_H2)
        return false, sock
    end
    h2_attach(conn, sock)
    return conn
end

-- ---- one request on one connection (no redirects) ----

-- connect options of a cleartext request (read, never changed, by socket_connect); none at
-- all, the usual case, saves socket_connect five lookups
local PLAIN = { [false] = nil, [true] = { deny_private = true, backlog = 0 } }

local function h2_result(head, nx)
    return head.status, header_table(head.fields), head.reason, head.version, nil, nx
end

-- HTTP/1.1, on a pooled or new connection (sock: one h2_open connected, on which the server
-- chose http/1.1 by ALPN)
-- -> status, headers, reason, version, body | nil, nx (see h1_exchange) | nil, err
local function h1_once(o, u, key, sock)
    for attempt = 1, 2 do
        if sock then
            o.rw_s = false -- h2_open set its timeouts
        else
            sock = get_sock()
            local left = o.deadline - now() -- seconds, as read_s computes them
            if left <= 0 then return nil, "timeout" end
            local ct = o.connect_ms and o.connect_ms / 1000 or left
            c_settimeouts(sock, ct < left and ct or left, left, left)
            o.rw_s = left
            local copts = PLAIN[o.deny_private]
            if u.scheme == "https" then
                copts = { deny_private = o.deny_private, backlog = 0 }
                copts.tls = { server_name = u.host:gsub("^%[(.*)%]$", "%1"), verify = o.verify,
                    cafile = o.cafile, alpn = "http/1.1" }
                copts.pool = key .. "#h1"
            end
            local cok, cerr = waited(c_connect(sock, u.host, u.port, copts))
            if not cok then
                c_close(sock)
                return nil, cerr
            end
        end
        local reused = c_reused(sock) > 0
        -- status, headers, reason, version, body, nx | nil, err, retry
        local st, v2, v3, v4, v5, v6 = h1_exchange(sock, o, u)
        if st then return st, v2, v3, v4, v5, v6 end
        c_close(sock)
        sock = nil
        -- a pooled connection the server had closed: once more on a new one (idempotent only)
        if not (v3 and reused and IDEMPOTENT[o.method]) or attempt == 2 then
            return nil, v2
        end
    end
end

-- -> status, headers, reason, version, body | nil, nx (see h1_exchange) | nil, err
local function once(o, u)
    local key = u.key -- u is cached by URL: the origin's key is made once
    if not key then
        key = u.scheme .. "://" .. u.host .. ":" .. u.port
        u.key = key
    end
    if u.scheme == "https" then
        -- the TLS settings are part of the key: a connection verified against one CA file is
        -- not one to hand to a request that trusts another (or the system store)
        key = key .. "#" .. tostring(o.verify) .. "#" .. tostring(o.cafile)
    elseif o.h2c then
        key = key .. "#h2c" -- HTTP/2 with prior knowledge (RFC 9113 §3.3)
    end
    local want_h2 = (u.scheme == "https" and o.http2 and not h1_origin[key])
        or (u.scheme == "http" and o.h2c)
    if not want_h2 then return h1_once(o, u, key) end
    local closed_retried = false
    for _ = 1, 3 do
        local conn = h2_pick(key)
        if not conn then
            local c2, err = h2_open(o, u, key)
            if c2 == false then return h1_once(o, u, key, err) end
            if not c2 then return nil, err end
            conn = c2
        end
        local head, nx, retry = h2_exchange(conn, o, u)
        if head then return h2_result(head, nx) end
        if not retry then return nil, nx end
        if nx == NOT_H2 then return h1_once(o, u, key) end
        if nx == "closed" then
            if closed_retried then return nil, nx end
            closed_retried = true
        end
        -- a GOAWAY excluded it (not processed), or the connection closed before an answer to
        -- an idempotent request: another connection may do
    end
    return nil, "closed"
end

-- ---- k.http.request ----

local NUMERIC_OPTS = { "timeout", "connect_timeout", "read_timeout", "max_body", "redirects",
    "pool_size", "keepalive" }

-- t: the options; url and method as given (k.http.get passes its own, without copying t)
local function check_opts(t, url, method)
    if type(t) ~= "table" then
        raise("k.http.request{url=, ...}: expected a table, got a " .. type(t))
    end
    if type(url) ~= "string" then
        raise("k.http.request: url must be a string, got a " .. type(url))
    end
    if method ~= nil and type(method) ~= "string" then
        raise("k.http.request: method must be a string, got a " .. type(method))
    end
    if t.headers ~= nil and type(t.headers) ~= "table" then
        raise("k.http.request: headers must be a table, got a " .. type(t.headers))
    end
    local b = t.body
    if b ~= nil and type(b) ~= "string" and type(b) ~= "function"
            and not (type(b) == "table" and type(b.read) == "function") then
        raise("k.http.request: body must be a string, a function giving chunks, or an object "
            .. "with a read method, got a " .. type(b))
    end
    for i = 1, #NUMERIC_OPTS do
        local n = NUMERIC_OPTS[i]
        local v = t[n]
        if v ~= nil and (type(v) ~= "number" or v < 0) then
            raise("k.http.request: " .. n .. " must be a number >= 0, got " .. tostring(v))
        end
    end
end

-- the request's fields when the caller gave no headers (read, never changed, by the codecs)
local DEFAULT_FIELDS = { [true] = { "User-Agent", "khamsin", "Accept-Encoding", "gzip, zstd" },
    [false] = { "User-Agent", "khamsin" } }

-- a body already read whole, as a chunk source (for stream = true and for a decoder)
local function source_of(body)
    return function()
        local b = body
        body = nil
        if b == "" then return nil end
        return b
    end
end

local function request(t, url, method)
    check_opts(t, url, method)
    local timeout = t.timeout or LIM.http_client_timeout_ms / 1000
    -- Every key of the constructor has a constant value, then each gets its real one (nil
    -- included: the key's slot stays): LuaJIT then copies a template that has all the keys,
    -- where expression values would insert them one at a time, rehashing as the table grows
    -- (~9 rehashes per request with `o` and `res`, a fifth of k.http's instructions).
    -- body: a string; a function or an object with a read method: streamed (body_src, and
    -- body_len when the caller's Content-Length frames it)
    local body, src = t.body, nil
    if type(body) == "function" then
        src, body = body, nil
    elseif type(body) == "table" then
        local rd = body
        src, body = function() return rd:read() end, nil
    end
    local o = { method = "", body = false, deadline = 0, connect_ms = false, read_ms = false,
        send_ms = false, max_body = 0, verify = true, cafile = false, http2 = true, h2c = false,
        deny_private = false, keepalive_ms = 0, pool_size = 0, fields = false, rw_s = false,
        body_src = false, body_len = false, body_pulled = false }
    o.method = method and method:upper() or ((body or src) and "POST" or "GET")
    o.body = body
    o.body_src = src
    o.body_len = nil
    o.deadline = now() + timeout
    o.connect_ms = t.connect_timeout and t.connect_timeout * 1000
    o.read_ms = t.read_timeout and t.read_timeout * 1000
    o.send_ms = t.read_timeout and t.read_timeout * 1000
    o.max_body = t.max_body and floor(t.max_body) or LIM.http_client_body_bytes
    o.verify = t.verify ~= false
    o.cafile = t.cafile
    o.http2 = t.http2 ~= false
    o.h2c = t.h2c and true or false
    o.deny_private = t.deny_private and true or false
    o.keepalive_ms = t.keepalive and t.keepalive * 1000 or LIM.socket_keepalive_ms
    o.pool_size = t.pool_size and floor(t.pool_size) or LIM.socket_pool_size
    local want_decode = t.decode ~= false
    local redirects = t.redirects and floor(t.redirects) or LIM.http_client_redirects
    local u, uerr = parse_url_cached(url)
    if not u then return nil, uerr end
    local first = u
    for hop = 0, redirects do
        if t.headers == nil then
            o.fields = DEFAULT_FIELDS[want_decode]
        else
            local fields, seen = flat_headers(t.headers, not same_origin(u, first))
            if not seen["user-agent"] then
                fields[#fields + 1] = "User-Agent"
                fields[#fields + 1] = "khamsin"
            end
            if want_decode and not seen["accept-encoding"] then
                fields[#fields + 1] = "Accept-Encoding"
                fields[#fields + 1] = "gzip, zstd"
            end
            if o.body_src and seen["content-length"] then
                -- the caller's length frames the streamed body (no chunked coding, and on h2
                -- the content-length field): taken out of the fields, which the client owns
                local kept = {}
                for i = 1, #fields, 2 do
                    if lower(fields[i]) == "content-length" then
                        local n = tonumber(fields[i + 1])
                        if not n or n < 0 or n % 1 ~= 0 then
                            raise("k.http.request: Content-Length must be an integer >= 0, got "
                                .. tostring(fields[i + 1]))
                        end
                        o.body_len = n
                    else
                        kept[#kept + 1] = fields[i]
                        kept[#kept + 1] = fields[i + 1]
                    end
                end
                fields = kept
            end
            o.fields = fields
        end
        if o.body_pulled and hop > 0 then
            return nil, "redirect: a streamed request body cannot be sent again"
        end
        -- headers: case-insensitive, lower-case keys; body: the whole body, or nil and nx
        local status, headers, reason, version, body, nx = once(o, u)
        if not status then return nil, headers end
        local loc = rawget(headers, "location")
        if REDIRECT[status] and loc and hop < redirects then
            if not body then
                local _, derr = drain(nx, o.max_body) -- the connection goes back to the pool
                if derr then return nil, derr end
            end
            local nu, nerr = parse_url(resolve(u, loc))
            if not nu then return nil, "redirect: " .. nerr end
            if status == 303 or ((status == 301 or status == 302) and o.method == "POST") then
                if o.method ~= "HEAD" then o.method = "GET" end
                o.body, o.body_src, o.body_len, o.body_pulled = nil, nil, nil, nil
            end
            u = nu
        else
            if REDIRECT[status] and loc and redirects > 0 then
                if not body then drain(nx, o.max_body) end
                return nil, "too many redirects"
            end
            local res = setmetatable({ status = 0, reason = "", headers = false, version = "",
                url = "", decoded = false, body = false }, res_mt) -- constant values: see `o`
            res.status, res.reason, res.headers, res.version, res.url = status, reason, headers,
                version, u.url
            res.body = nil
            local ce = want_decode and rawget(headers, "content-encoding")
            local dec
            if ce and o.method ~= "HEAD" and status ~= 204 and status ~= 304 then
                dec = decoder(ce, o.max_body)
                if dec then res.decoded = ce end
            end
            if body and not dec and not t.stream then
                if #body > o.max_body then return nil, "response body too large" end
                res.body = body
                return res
            end
            local source = nx or source_of(body)
            if dec then source = decoding(source, dec) end
            if t.stream then
                res._next = source
                return res
            end
            local b, berr = drain(source, o.max_body)
            if not b then return nil, berr end
            res.body = b
            return res
        end
    end
end

-- k.http.request{method=, url=, headers=, body=, timeout=, connect_timeout=, read_timeout=,
-- max_body=, redirects=, stream=, decode=, verify=, cafile=, http2=, h2c=, deny_private=,
-- pool_size=, keepalive=}
-- -> res | nil, reason
function M.request(t)
    if type(t) ~= "table" then
        raise("k.http.request{url=, ...}: expected a table, got a " .. type(t))
    end
    return request(t, t.url, t.method)
end

local NO_OPTS = {}

-- k.http.get(url [, opts]) -> res | nil, reason
function M.get(url, opts)
    if opts ~= nil and type(opts) ~= "table" then
        raise("k.http.get(url, opts): opts must be a table, got a " .. type(opts))
    end
    opts = opts or NO_OPTS
    return request(opts, url, opts.method or "GET")
end

return M
