-- k.socket.luasocket()'s select on several sockets, settimeout's "t" (total) mode, and the keep-alive
-- pool without MSG_PEEK (a parked connection the peer closes is dropped) (issue 14).
-- The peers are khamsin itself: a connection to the server that sends nothing is never readable,
-- one that asks /late?ms=N is readable N ms later, one that asks with Connection: close reaches
-- EOF. Each route returns its findings as a JSON list.
local server = require "spec.helpers.server"
local snippets = require "spec.helpers.app_snippets"
local socket = require "socket"

local APP = [[
local k = require "khamsin"
local json = k.json

]] .. snippets.RESULTS .. [[

local function self_port(req) return tonumber(req.headers.host:match(":(%d+)$")) end

k.get("/late", function(req)
    local ms = tonumber(req.args.ms)
    if ms > 0 then k.sleep(ms / 1000) end
    return "late"
end)

k.get("/ping", function() return "pong" end)

k.get("/select", function(req)
    local sock = k.socket.luasocket()
    local port = self_port(req)
    local idle = assert(sock.connect("127.0.0.1", port)) -- sends nothing: never readable
    local slow = assert(sock.connect("127.0.0.1", port))
    local fast = assert(sock.connect("127.0.0.1", port))
    assert(slow:send("GET /late?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert(fast:send("GET /late?ms=0 HTTP/1.1\r\nHost: x\r\n\r\n"))
    -- 1: three sockets, nothing buffered yet: waits, fast answers first
    local t0 = sock.gettime()
    local r1, w1, e1 = sock.select({ idle, slow, fast }, nil, 10)
    local d1 = sock.gettime() - t0
    local line = fast:receive("*l")
    fast:close()
    -- 2: waits on idle and slow (fast closed: skipped) until slow answers
    t0 = sock.gettime()
    local r2, w2, e2 = sock.select({ idle, slow, fast }, {}, 10)
    local d2 = sock.gettime() - t0
    -- 3: nothing comes: the timeout
    t0 = sock.gettime()
    local r3, w3, e3 = sock.select({ idle }, nil, 0.3)
    local d3 = sock.gettime() - t0
    -- 4: writable: the open sockets of sendt (closed ones and other values skipped), at once
    local r4, w4, e4 = sock.select(nil, { idle, slow, fast, "x", idle }, 0)
    -- 5: slow has its answer buffered: readable at once, beside a writable one
    local r5, w5, e5 = sock.select({ idle, slow }, { idle })
    -- 6: the peer closed: readable (a receive answers at once)
    local eofs = assert(sock.connect("127.0.0.1", port))
    assert(eofs:send("GET /late?ms=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    local all = eofs:receive("*a")
    t0 = sock.gettime()
    local r6, _, e6 = sock.select({ idle, eofs }, nil, 5)
    local d6 = sock.gettime() - t0
    local after, after_err = eofs:receive()
    idle:close()
    slow:close()
    eofs:close()
    return r(
        #r1, r1[1] == fast, r1[fast], r1[idle] == nil and r1[slow] == nil, #w1, e1, d1 < 1.2,
        line,
        #r2, r2[1] == slow, r2[slow], #w2, e2, d2 > 0.2,
        #r3, #w3, e3, d3 >= 0.25,
        #r4, #w4, w4[1] == idle, w4[2] == slow, w4[idle], w4[slow], w4[fast] == nil, e4,
        #r5, r5[1] == slow, #w5, w5[1] == idle, e5,
        all:match("late$"), #r6, r6[1] == eofs, r6[eofs], e6, d6 < 1, after, after_err)
end)

local waits = { started = 0, ended = 0 }
k.get("/select_wait", function(req) -- held by the spec, which then leaves
    local sock = k.socket.luasocket()
    local a = assert(sock.connect("127.0.0.1", self_port(req)))
    local b = assert(sock.connect("127.0.0.1", self_port(req)))
    waits.started = waits.started + 1
    local rr, _, err = sock.select({ a, b }, nil, 30)
    waits.ended = waits.ended + 1 -- never: the wait ends with the request
    return r(#rr, err)
end)
k.get("/waits", function() return r(waits.started, waits.ended) end)

-- The pool without MSG_PEEK: a parked connection keeps reading, so the peer's close reaches it
-- in the pool (dropped there) and a live one is handed out again as it is.
k.get("/pool_close", function(req)
    local port = self_port(req)
    local function exchange(s, close)
        assert(s:send("GET /late?ms=0 HTTP/1.1\r\nHost: x\r\n"
            .. (close and "Connection: close\r\n" or "") .. "\r\n"))
        local status = s:receive("*l")
        repeat local l = s:receive("*l") until l == ""
        assert(s:receive(4) == "late")
        return status
    end
    local a = k.socket.tcp()
    assert(a:connect("127.0.0.1", port, { pool = "pc" }))
    local st1 = exchange(a, false)
    local ka1 = a:setkeepalive(10000, 4)
    local b = k.socket.tcp()
    assert(b:connect("127.0.0.1", port, { pool = "pc" }))
    local reused_b = b:getreusedtimes() -- the parked one, live
    local st2 = exchange(b, true)       -- the server closes after this answer
    local ka2 = b:setkeepalive(10000, 4) -- parked before or after its EOF came: either way...
    k.sleep(0.3)
    local c = k.socket.tcp()
    assert(c:connect("127.0.0.1", port, { pool = "pc" }))
    local reused_c = c:getreusedtimes() -- ...it is not handed out again
    local st3 = exchange(c, false)
    c:close()
    return r(st1, ka1, reused_b, st2, ka2 == 1 or ka2 == nil, reused_c, st3)
end)

k.get("/tmode", function(req)
    local sock = k.socket.luasocket()
    local s = assert(sock.connect("127.0.0.1", self_port(req))) -- never answers
    local one = s:settimeout(5)
    s:settimeout(0.2, "t") -- total below block: the call waits 0.2 s
    local t0 = sock.gettime()
    local _, err1 = s:receive()
    local took1 = sock.gettime() - t0
    s:settimeout(nil, "t") -- no total: block (5 s) again, then block 0.4
    s:settimeout(0.4)
    t0 = sock.gettime()
    local _, err2 = s:receive()
    local took2 = sock.gettime() - t0
    s:settimeout(0.3, "r") -- "r" is luasocket's other name for total
    t0 = sock.gettime()
    local _, err3 = s:receive()
    local took3 = sock.gettime() - t0
    local ok, bad = pcall(s.settimeout, s, 1, "x")
    s:close()
    return r(one, err1, took1 >= 0.15 and took1 < 1.5, err2, took2 >= 0.35 and took2 < 3,
        err3, took3 >= 0.25 and took3 < 0.39 + 1, ok, tostring(bad):match("invalid timeout mode") ~= nil)
end)
]]

local srv

local function get_json(path)
    local res = srv:request { path = path, timeout = 30 }
    assert.are.equal(200, res.status, res.body)
    return require("cjson").decode(res.body)
end

describe("k.socket select and timeout modes", function()
    setup(function()
        srv = server.start { app = APP, tls = false }
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    it("select waits on several sockets at once and answers luasocket's lists (array and keys)",
        function()
            assert.are.same({
                1, true, true, true, 0, "nil", true,
                "HTTP/1.1 200 OK",
                1, true, true, 0, "nil", true,
                0, 0, "timeout", true,
                0, 2, true, true, true, true, true, "nil",
                1, true, 1, true, "nil",
                "late", 1, true, true, "nil", true, "nil", "closed",
            }, get_json("/select"))
        end)

    it("a client that leaves while select waits ends the wait; the worker goes on", function()
        local c = assert(socket.connect("127.0.0.1", srv.port))
        assert(c:send("GET /select_wait HTTP/1.1\r\nHost: 127.0.0.1:" .. srv.port .. "\r\n\r\n"))
        assert(server.wait_until(10, function() return get_json("/waits")[1] == 1 end, 0.05))
        c:close()
        socket.sleep(0.3)
        local res = srv:request { path = "/ping" }
        assert.are.equal(200, res.status)
        assert.are.equal("pong", res.body)
        assert.are.same({ 1, 0 }, get_json("/waits"))
    end)

    it("a pooled connection the peer closes while parked is dropped; a live one is reused",
        function()
            assert.are.same({ "HTTP/1.1 200 OK", 1, 1, "HTTP/1.1 200 OK", true, 0,
                "HTTP/1.1 200 OK" }, get_json("/pool_close"))
        end)

    it("settimeout's 't' mode caps a call: the smaller of block and total", function()
        assert.are.same({ 1, "timeout", true, "timeout", true, "timeout", true, false, true },
            get_json("/tmode"))
    end)
end)
