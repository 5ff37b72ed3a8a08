-- k.socket (issue 14, items 1, 2 and 4): luasocket's methods and return conventions on sockets
-- whose waits yield the coroutine, against real peers: spec/helpers/sock_peer.py (echo, a peer
-- that never reads, one that never answers, one that sends "abc" and closes, a listener whose
-- accept queue is full) and a second khamsin serving TLS with a certificate made here.
local server = require "spec.helpers.server"
local upstream = require "spec.helpers.upstream"
local snippets = require "spec.helpers.app_snippets"

local PEER = server.root .. "/spec/helpers/sock_peer.py"

local function start_peer() return upstream.start(PEER, { life = 300, wait = 10 }) end

local stop_peer = upstream.stop

local free_port = server.free_port

local function events(p)
    return server.read_file(p.dir .. "/events") or ""
end

local peer, tls_srv, srv, certdir
local ports

local APP = [[
local k = require "khamsin"
local P = {PORTS}
local json = k.json

]] .. snippets.RESULTS .. [[

local preload = { k.socket.tls_preload() } -- while the script loads
local preload_bad = { k.socket.tls_preload { cafile = "/nonexistent/ca.pem" } }
k.get("/preload", function() return r(preload[1], preload_bad[1], preload_bad[2]) end)

k.get("/refused", function(req)
    local s = k.socket.tcp()
    return r(s:connect("127.0.0.1", tonumber(req.args.port)))
end)

k.get("/patterns", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.echo))
    assert(s:send("one\r\ntw\ro\nthree\n0123456789"))
    local a = s:receive("*l")
    local b = s:receive()
    local c = s:receive("*l", "pre-")
    local d = s:receive(4)
    local e = s:receive(6)
    local peer_ip, peer_port = s:getpeername()
    s:close()
    return r(a, b, c, d, e, peer_ip, peer_port == P.echo, s:send("x"))
end)

k.get("/partial", function()
    local out = {}
    for _, pat in ipairs { 10, "*l", "*a" } do
        local s = k.socket.tcp()
        assert(s:connect("127.0.0.1", P.abc))
        local d, err, partial = s:receive(pat)
        out[#out + 1] = { d or "nil", err or "nil", partial or "nil" }
        s:close()
    end
    return json.encode(out)
end)

k.get("/read_timeout", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.mute))
    s:settimeout(0.2)
    local t0 = k.now()
    local d, err, partial = s:receive()
    local took = k.now() - t0
    -- a read timeout leaves the socket usable
    local sent, serr = s:send("still here\n")
    s:close()
    return r(d, err, partial, took >= 0.15 and took < 3, sent, serr)
end)

k.get("/send_timeout", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.sink))
    s:settimeouts(2000, 200, 2000)
    local big = ("x"):rep(16 * 1024 * 1024)
    local t0 = k.now()
    local last, err, sent = s:send(big)
    local took = k.now() - t0
    local after = { s:send("y") }
    return r(last, err, sent > 0 and sent < #big, took < 5, after[1], after[2])
end)

k.get("/connect_timeout", function()
    local s = k.socket.tcp()
    s:settimeouts(300, nil, nil)
    local t0 = k.now()
    local ok, err = s:connect("127.0.0.1", P.full)
    local took = k.now() - t0
    return r(ok, err, took >= 0.25 and took < 3)
end)

k.get("/keepalive", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.echo))
    local first = s:getreusedtimes()
    assert(s:send("ping\n")); assert(s:receive() == "ping")
    local ka = s:setkeepalive(10000, 10)
    local s2 = k.socket.tcp()
    assert(s2:connect("127.0.0.1", P.echo))
    local second = s2:getreusedtimes()
    assert(s2:send("pong\n"))
    local echo = s2:receive()
    s2:close()
    return r(first, ka, second, echo)
end)

k.get("/pool_bound", function()
    local socks = {}
    for i = 1, 6 do
        socks[i] = k.socket.tcp()
        assert(socks[i]:connect("127.0.0.1", P.echo, { pool = "bound" }))
    end
    local st0 = k.socket.stats()
    for i = 1, 6 do assert(socks[i]:setkeepalive(10000, 2)) end
    local st = k.socket.stats()
    -- unread input: not poolable, closed, with the reason
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.abc, { pool = "dirty" }))
    k.sleep(0.1)
    local ok, err = s:setkeepalive()
    -- the idle timeout closes pooled ones
    local t = k.socket.tcp()
    assert(t:connect("127.0.0.1", P.echo, { pool = "short" }))
    t:setkeepalive(100, 5)
    local idle_before = k.socket.stats().idle
    k.sleep(0.4)
    local st2 = k.socket.stats()
    return r(st0.open - st.open, st.idle, st.evicted >= 4, ok, err, idle_before - st2.idle)
end)

k.get("/tls", function(req)
    local port = tonumber(req.args.port)
    local out = {}
    local function try(opts, send)
        local s = k.socket.tcp()
        assert(s:connect("127.0.0.1", port))
        local ok, err = s:tls(opts)
        local res = { ok = ok or "nil", err = err or "nil", alpn = s:alpn() or "nil" }
        if ok and send then
            assert(s:send("GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
            local body = s:receive("*a")
            res.body = body:match("\r\n\r\n(.*)$")
        end
        s:close()
        out[#out + 1] = res
    end
    try({ server_name = "localhost" })                                   -- 1 system store: fails
    try({ server_name = "localhost", verify = false }, true)             -- 2 no check: works
    try({ server_name = "localhost", cafile = req.args.ca }, true)       -- 3 our CA: works
    try({ server_name = "other.example", cafile = req.args.ca })         -- 4 wrong name: fails
    try({ server_name = "localhost", cafile = req.args.ca, alpn = { "h2", "http/1.1" } }) -- 5
    try({ server_name = "localhost", cafile = req.args.ca, alpn = { "http/1.1" } })       -- 6
    -- TLS in connect's options: pooled with its TLS settings, reused without a new handshake
    local s = k.socket.tcp()
    local tls = { server_name = "localhost", cafile = req.args.ca }
    assert(s:connect("127.0.0.1", port, { tls = tls }))
    assert(s:send("GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"))
    local status = s:receive()
    repeat local l = s:receive() until l == ""
    assert(s:receive(9))
    assert(s:setkeepalive())
    local s2 = k.socket.tcp()
    assert(s2:connect("127.0.0.1", port, { tls = tls }))
    local reused = s2:getreusedtimes()
    assert(s2:tls(tls)) -- a no-op on a pooled TLS connection with the same settings
    assert(s2:send("GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
    local again = s2:receive("*a"):match("\r\n\r\n(.*)$")
    s2:close()
    out[#out + 1] = { status = status, reused = reused, again = again }
    return json.encode(out)
end)

k.get("/tls_errors", function()
    local s = k.socket.tcp()
    s:settimeouts(300, 1000, 1000)
    assert(s:connect("127.0.0.1", P.mute))
    local ok, err = s:tls { server_name = "localhost" }       -- never answers
    local s2 = k.socket.tcp()
    assert(s2:connect("127.0.0.1", P.echo))
    local ok2, err2 = s2:tls { server_name = "localhost" }    -- its ClientHello comes back
    local ok3, err3 = s2:send("x")                            -- a failed handshake closed it
    return r(ok, err, ok2, err2, ok3, err3)
end)

k.get("/hang", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.mute))
    s:receive() -- the client leaves while this waits
    return "never"
end)

k.get("/backlog", function()
    local c0 = k.socket.stats().connects
    local done, errs = 0, {}
    for i = 1, 6 do
        k.timer(0, function()
            local s = k.socket.tcp()
            local ok, err = s:connect("127.0.0.1", P.echo, { pool = "bl", pool_size = 2, backlog = 10 })
            if not ok then errs[#errs + 1] = err; done = done + 1; return end
            s:send("x" .. i .. "\n")
            local line = s:receive()
            if line ~= "x" .. i then errs[#errs + 1] = tostring(line) end
            k.sleep(0.05)
            assert(s:setkeepalive(10000, 2))
            done = done + 1
        end)
    end
    k.sleep(0.01)
    -- two busy, four waiting: a connect with no backlog is refused at once
    local s = k.socket.tcp()
    local ok, err = s:connect("127.0.0.1", P.echo, { pool = "bl", pool_size = 2, backlog = 0 })
    for _ = 1, 250 do
        if done == 6 then break end
        k.sleep(0.02)
    end
    return r(done, #errs, k.socket.stats().connects - c0, ok, err)
end)

k.get("/stats", function() return json.encode(k.socket.stats()) end)

local from_timer, from_sub
k.subscribe("sock", function(v)
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.echo))
    s:send(v .. "\n")
    from_sub = s:receive()
    s:close()
end)
k.get("/callbacks", function()
    from_timer, from_sub = nil, nil
    k.timer(0, function()
        local s = k.socket.tcp()
        assert(s:connect("localhost", P.echo))
        s:send("timer\n")
        from_timer = s:receive()
        s:close()
    end)
    k.publish("sock", "subscriber")
    for _ = 1, 100 do
        if from_timer and from_sub then break end
        k.sleep(0.02)
    end
    return r(from_timer, from_sub)
end)

k.get("/user_coroutine", function()
    local lines = coroutine.wrap(function()
        local s = k.socket.tcp()
        assert(s:connect("127.0.0.1", P.echo))
        s:send("a\nb\n")
        coroutine.yield(s:receive())
        coroutine.yield(s:receive())
        s:close()
    end)
    local ok, first, second = pcall(function() return lines(), lines() end)
    return r(ok, first, second)
end)

k.get("/pool_thread", function()
    local ok, err = pcall(k.blocking, function() return require("khamsin.socket") ~= nil end)
    return r(ok, tostring(err))
end)

k.get("/misuse", function()
    local s = k.socket.tcp()
    local ok, err = pcall(s.connect, s, "127.0.0.1", 70000)
    local ok2, err2 = pcall(s.receive, s, "*x")
    return r(ok, err, ok2, err2)
end)

k.get("/shared", function()
    local s = k.socket.tcp()
    assert(s:connect("127.0.0.1", P.mute))
    s:settimeout(0.3)
    local res
    k.timer(0, function() res = { s:receive() } end)
    k.sleep(0.05)
    local ok, err = pcall(s.receive, s)
    while not res do k.sleep(0.02) end
    s:close()
    return r(ok, err, res[2])
end)

k.get("/private", function()
    local s = k.socket.tcp()
    local ok, err = s:connect("localhost", P.echo, { deny_private = true })
    local ips = k.socket.resolve("localhost")
    local s2 = k.socket.tcp()
    local ok2 = s2:connect("127.0.0.1", P.echo)
    s2:close()
    return r(ok, err, ips[1], ok2)
end)

k.get("/luasocket", function()
    package.loaded.socket = k.socket.luasocket()
    local sock = require "socket"
    local c = assert(sock.connect("127.0.0.1", P.echo))
    local t0 = sock.gettime()
    local empty = { sock.select({ c }, nil, 0.1) }
    c:send("hi\n")
    local ready = sock.select({ c }, nil, 1)
    local line = c:receive("*l")
    sock.sleep(0.05)
    local waited = sock.gettime() - t0
    local ip = sock.dns.toip("localhost")
    c:close()
    local try_ok, try_err = sock.protect(function() sock.try(nil, "boom") end)()
    return r(#empty[1], empty[3], #ready, line, waited >= 0.04, ip, try_ok, try_err,
        type(t0) == "number" and t0 > 1e9)
end)
]]

local CAP_APP = [[
local k = require "khamsin"
local P = {PORTS}
k.get("/cap", function()
    local a, b, c = k.socket.tcp(), k.socket.tcp(), k.socket.tcp()
    assert(a:connect("127.0.0.1", P.echo))
    assert(b:connect("127.0.0.1", P.echo))
    local ok, err = c:connect("127.0.0.1", P.echo)
    a:close()
    local ok2 = c:connect("127.0.0.1", P.echo)
    return tostring(ok) .. "|" .. tostring(err) .. "|" .. tostring(ok2)
end)
]]

local function ports_lua(p)
    local t = {}
    for k, v in pairs(p) do t[#t + 1] = k .. " = " .. v end
    return "{ " .. table.concat(t, ", ") .. " }"
end

local function get_json(path)
    local res = srv:request { path = path, timeout = 20 }
    assert.are.equal(200, res.status, res.body)
    return require("cjson").decode(res.body)
end

describe("k.socket", function()
    setup(function()
        peer = start_peer()
        ports = peer.ports
        certdir = upstream.make_cert()
        tls_srv = server.start {
            app = 'local k = require "khamsin"\nk.get("/hello", function() return "tls-hello" end)',
            listen = { "tls://127.0.0.1:0" },
            args = { "--tls-cert", certdir .. "/cert.pem", "--tls-key", certdir .. "/key.pem" },
        }
        srv = server.start { app = (APP:gsub("{PORTS}", ports_lua(ports))), tls = false }
    end)

    teardown(function()
        if srv then srv:stop() end
        if tls_srv then tls_srv:stop() end
        if peer then stop_peer(peer) end
        if certdir then os.execute("rm -rf " .. server.sh_quote(certdir)) end
    end)

    it("connect to a closed port: nil, 'connection refused'", function()
        local t = get_json("/refused?port=" .. free_port())
        assert.are.same({ "nil", "connection refused" }, t)
    end)

    it("receive *l (every CR dropped), the default pattern, a prefix, n bytes; getpeername; "
        .. "send after close answers nil, 'closed'", function()
        local t = get_json("/patterns")
        assert.are.same({ "one", "two", "pre-three", "0123", "456789", "127.0.0.1", true, "nil",
            "closed", 0 }, t)
    end)

    it("a peer that closes: receive(n) and *l give nil, 'closed', partial; *a gives the data",
        function()
            local t = get_json("/partial")
            assert.are.same({ { "nil", "closed", "abc" }, { "nil", "closed", "abc" },
                { "abc", "nil", "nil" } }, t)
        end)

    it("read timeout: nil, 'timeout', '' after ~0.2 s, and the socket stays usable", function()
        assert.are.same({ "nil", "timeout", "", true, 11, "nil" }, get_json("/read_timeout"))
    end)

    it("send timeout to a peer that never reads: nil, 'timeout', bytes sent; then closed",
        function()
            assert.are.same({ "nil", "timeout", true, true, "nil", "closed" },
                get_json("/send_timeout"))
        end)

    it("connect timeout (accept queue full): nil, 'timeout'", function()
        assert.are.same({ "nil", "timeout", true }, get_json("/connect_timeout"))
    end)

    it("setkeepalive parks the connection; the next connect to the same host and port reuses it",
        function()
            assert.are.same({ 0, 1, 1, "pong" }, get_json("/keepalive"))
        end)

    it("the pool keeps pool_size per key, evicts the oldest, refuses unread input, closes after "
        .. "the idle time", function()
        local t = get_json("/pool_bound")
        -- 6 parked with size 2: 4 closed; then 'dirty' refused and closed; 'short' expired
        assert.are.same({ 4, 2, true, "nil", "unread data in the buffer", 1 }, t)
    end)

    it("pool_size caps the connections of a key: the others wait (backlog) and get parked ones",
        function()
            assert.are.same({ 6, 0, 2, "nil",
                "too many waiting connections (pool_size 2 busy, backlog 0 full)" },
                get_json("/backlog"))
        end)

    it("k.socket.tls_preload loads TLS while the script loads; a bad cafile says why", function()
        local t = get_json("/preload")
        assert.are.equal(true, t[1])
        assert.are.equal("nil", t[2])
        assert.matches("tls: cannot load the CA certificates of /nonexistent/ca.pem", t[3])
    end)

    it("TLS: verify against the system store fails on a self-signed certificate; verify=false "
        .. "and cafile work; the name is checked; ALPN; pooled TLS connections", function()
        local t = get_json("/tls?port=" .. tls_srv.port .. "&ca=" .. certdir .. "/cert.pem")
        assert.are.equal("nil", t[1].ok)
        assert.matches("^tls: certificate verify failed: self.signed certificate", t[1].err)
        assert.are.equal(1, t[2].ok)
        assert.are.equal("tls-hello", t[2].body)
        assert.are.equal(1, t[3].ok)
        assert.are.equal("tls-hello", t[3].body)
        assert.are.equal("nil", t[4].ok)
        assert.matches("certificate verify failed: hostname mismatch", t[4].err)
        assert.are.equal("h2", t[5].alpn)
        assert.are.equal("http/1.1", t[6].alpn)
        assert.are.equal("HTTP/1.1 200 OK", t[7].status)
        assert.are.equal(1, t[7].reused)
        assert.are.equal("tls-hello", t[7].again)
    end)

    it("TLS handshake errors: timeout, garbage from the peer; the socket is closed after",
        function()
            local t = get_json("/tls_errors")
            assert.are.equal("nil", t[1])
            assert.are.equal("timeout", t[2])
            assert.are.equal("nil", t[3])
            assert.matches("^tls: handshake failed: ", t[4])
            assert.are.equal("nil", t[5])
            assert.are.equal("closed", t[6])
        end)

    for _, proto in ipairs { "h1", "h2c" } do
    it("a client that leaves cancels the wait and closes the socket (" .. proto .. ")", function()
        local before = select(2, events(peer):gsub("mute%-closed", ""))
        local res = srv:request { path = "/hang", timeout = 0.5, proto = proto }
        assert.is_not.equal(200, res.status)
        local closed = server.wait_until(10, function()
            return select(2, events(peer):gsub("mute%-closed", "")) > before
        end, 0.05)
        assert.truthy(closed, "the upstream socket was not closed")
        local st = server.wait_until(5, function()
            local s = get_json("/stats")
            return s.open == s.idle and s
        end, 0.05)
        assert.truthy(st, "a socket stayed open: " .. require("cjson").encode(get_json("/stats")))
    end)
    end

    it("works in timer and subscriber callbacks", function()
        assert.are.same({ "timer", "subscriber" }, get_json("/callbacks"))
    end)

    it("waits inside the app's own coroutines (coroutine.wrap) and pcall", function()
        assert.are.same({ true, "a", "b" }, get_json("/user_coroutine"))
    end)

    it("is refused in a k.blocking pool thread with a clear error", function()
        local t = get_json("/pool_thread")
        assert.are.equal(false, t[1])
        assert.matches("not in a k.blocking pool thread", t[2])
    end)

    it("misuse raises at the app's line", function()
        local t = get_json("/misuse")
        assert.are.equal(false, t[1])
        assert.matches("app.lua:%d+: sock:connect%(host, port%): port must be", t[2])
        assert.are.equal(false, t[3])
        assert.matches("app.lua:%d+: sock:receive%(pattern%)", t[4])
    end)

    it("a socket another coroutine waits on refuses a second wait (and stays the first one's)",
        function()
            local t = get_json("/shared")
            assert.are.equal(false, t[1])
            assert.matches("app.lua:%d+: sock:receive: another coroutine waits on this socket", t[2])
            assert.are.equal("timeout", t[3])
        end)

    it("deny_private refuses a host that resolves to loopback; k.socket.resolve", function()
        local t = get_json("/private")
        assert.are.equal("nil", t[1])
        assert.matches("refused: localhost resolves to a private or loopback address", t[2])
        assert.are.equal("127.0.0.1", t[3])
        assert.are.equal(1, t[4])
    end)

    it("k.socket.luasocket() stands in for require 'socket': connect, select, sleep, gettime, "
        .. "dns, try/protect", function()
        assert.are.same({ 0, "timeout", 1, "hi", true, "127.0.0.1", "nil", "boom", true },
            get_json("/luasocket"))
    end)

    it("is refused while the script loads", function()
        local ok, err = pcall(server.start, {
            app = 'local k = require "khamsin"\nlocal s = k.socket.tcp()\n', tls = false })
        assert.is_false(ok)
        assert.matches("app.lua:2: k.socket.tcp%(%): sockets are made in a handler", err)
    end)

    it("outbound_sockets caps the open sockets of a worker", function()
        local cap = server.start { app = (CAP_APP:gsub("{PORTS}", ports_lua(ports))), tls = false,
            args = { "--outbound-sockets", "2" } }
        local res = cap:request { path = "/cap" }
        cap:stop()
        assert.are.equal(200, res.status)
        assert.are.equal("nil|too many outbound sockets (outbound_sockets)|1", res.body)
    end)
end)
