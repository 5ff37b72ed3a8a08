-- Limits: --print-limits, bad values, the --limit name=value and --name-with-dashes forms, and
-- for each limit: what is allowed up to it and what happens one past it (status + close).
--
-- Boundaries (the spec's reading of the names):
-- * header_bytes: bytes of the whole head, request line through the empty line's CRLF;
--   a head of exactly header_bytes is accepted, one byte more gets 431.
-- * header_fields: field lines, Host included; exactly header_fields is accepted.
-- * target_bytes: bytes of the request-target; exactly target_bytes is accepted, one more -> 414.
-- * body_bytes: bytes of the (decoded) body; exactly body_bytes is accepted, one more -> 413.
local server = require "helpers.server"

local LIMITS = {
    -- name, default
    { "header_bytes", "16384" },
    { "header_fields", "100" },
    { "target_bytes", "8192" },
    { "body_bytes", "8388608" },
    { "header_timeout_ms", "10000" },
    { "keepalive_timeout_ms", "60000" },
    { "body_timeout_ms", "60000" },
    { "write_timeout_ms", "30000" },
    { "connections", "100000" },
}

local APP = [[
local k = require "khamsin"
k.get("/", function() return "ok" end)
k.get("/t", function() return "t" end)
k.post("/echo", function(req) return req:body() end)
k.post("/len", function(req) return tostring(#req:body()) end)
k.get("/big", function() return ("x"):rep(32 * 1024 * 1024) end)
]]

-- A GET head of exactly n bytes (padding in an X-Pad field).
local function head_of(n, extra)
    local pre = "GET / HTTP/1.1\r\nHost: x\r\n" .. (extra or "") .. "X-Pad: "
    local post = "\r\n\r\n"
    local pad = n - #pre - #post
    assert(pad >= 1, "head too small for its padding")
    local h = pre .. ("p"):rep(pad) .. post
    assert(#h == n)
    return h
end

local function ok_response(srv, bytes)
    local c = assert(srv:raw_conn())
    c:send(bytes)
    local r, err = c:read_response { timeout = 3 }
    c:close()
    assert.truthy(r, "no response: " .. tostring(err))
    return r
end

describe("limits", function()
    describe("on the command line", function()
        it("--print-limits lists every limit with its default and exits 0", function()
            local r = server.run { args = { "--print-limits" } }
            assert.are.equal(0, r.code, r.stderr)
            local out = r.stdout .. r.stderr
            for _, l in ipairs(LIMITS) do
                local line
                for ln in out:gmatch("[^\n]+") do
                    if ln:find(l[1], 1, true) and not ln:find(l[1] .. "_", 1, true) then line = line or ln end
                end
                assert.truthy(line, l[1] .. " missing from --print-limits:\n" .. out)
                assert.truthy(line:find("%f[%d]" .. l[2] .. "%f[%D]"),
                    l[1] .. " does not show its default " .. l[2] .. ": " .. line)
            end
        end)

        it("--print-limits shows a value set on the command line", function()
            local r = server.run { args = { "--limit", "header_bytes=2048", "--print-limits" } }
            assert.are.equal(0, r.code, r.stderr)
            local line = (r.stdout .. r.stderr):match("[^\n]*header_bytes[^\n]*")
            assert.truthy(line and line:find("%f[%d]2048%f[%D]"), tostring(line))
        end)

        it("a value out of range exits non-zero with a message naming the limit and its range", function()
            local r = server.run { app = APP, args = { "--listen", "127.0.0.1:0", "--limit", "header_bytes=1" } }
            assert.are_not.equal(0, r.code)
            assert.are_not.equal(124, r.code, "khamsin started anyway (timed out)")
            assert.truthy(r.stderr:find("header_bytes", 1, true), r.stderr)
            local numbers = {}
            for n in r.stderr:gsub("header_bytes=1", ""):gmatch("%d+") do numbers[n] = true end
            -- the range: a minimum and a maximum
            local count = 0
            for n in pairs(numbers) do
                if tonumber(n) > 1 then count = count + 1 end
            end
            assert.truthy(count >= 2, "no range (min and max) in: " .. r.stderr)
        end)

        it("a value over the maximum exits non-zero naming the limit", function()
            local r = server.run { app = APP, args = { "--listen", "127.0.0.1:0", "--header-bytes", "999999999999" } }
            assert.are_not.equal(0, r.code)
            assert.are_not.equal(124, r.code)
            assert.truthy(r.stderr:find("header_bytes", 1, true) or r.stderr:find("header-bytes", 1, true), r.stderr)
        end)

        it("a value that is not a number exits non-zero naming the limit", function()
            local r = server.run { app = APP, args = { "--listen", "127.0.0.1:0", "--limit", "body_bytes=lots" } }
            assert.are_not.equal(0, r.code)
            assert.are_not.equal(124, r.code)
            assert.truthy(r.stderr:find("body_bytes", 1, true), r.stderr)
        end)

        it("an unknown limit exits non-zero naming it", function()
            local r = server.run { app = APP, args = { "--listen", "127.0.0.1:0", "--limit", "no_such_limit=5" } }
            assert.are_not.equal(0, r.code)
            assert.are_not.equal(124, r.code)
            assert.truthy(r.stderr:find("no_such_limit", 1, true), r.stderr)
        end)
    end)

    describe("defaults", function()
        local srv
        setup(function() srv = server.start { app = APP } end)
        teardown(function() if srv then srv:stop() end end)

        it("accept a 12 KiB head, 100 fields and an 8 KiB target", function()
            local r = ok_response(srv, head_of(12 * 1024, "Connection: close\r\n"))
            assert.are.equal(200, r.status)
            local fields = { "GET / HTTP/1.1", "Host: x", "Connection: close" }
            for i = 1, 98 do fields[#fields + 1] = "X-F" .. i .. ": v" end -- 100 fields in all
            r = ok_response(srv, table.concat(fields, "\r\n") .. "\r\n\r\n")
            assert.are.equal(200, r.status)
            local target = "/t?" .. ("a"):rep(8192 - 3)
            r = ok_response(srv, "GET " .. target .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert.are.equal(200, r.status)
        end)

        it("answer 431 past 16384 head bytes and 414 past 8192 target bytes", function()
            server.assert_refused(srv, head_of(16385), 431)
            server.assert_refused(srv, "GET /t?" .. ("a"):rep(8192 - 2) .. " HTTP/1.1\r\nHost: x\r\n\r\n", 414)
        end)
    end)

    describe("header_bytes", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--limit", "header_bytes=2048" } } end)
        teardown(function() if srv then srv:stop() end end)

        it("accepts a head of exactly header_bytes", function()
            local r = ok_response(srv, head_of(2048))
            assert.are.equal(200, r.status)
        end)

        it("answers 431 and closes one byte past it", function()
            server.assert_refused(srv, head_of(2049), 431)
        end)

        it("answers 431 and closes for a head that never ends", function()
            server.assert_refused(srv, "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " .. ("p"):rep(4000), 431)
        end)
    end)

    describe("header_bytes as --header-bytes", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--header-bytes", "1024" } } end)
        teardown(function() if srv then srv:stop() end end)

        it("takes the dashed flag", function()
            assert.are.equal(200, ok_response(srv, head_of(1024)).status)
            server.assert_refused(srv, head_of(1025), 431)
        end)
    end)

    describe("header_fields", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--limit", "header_fields=10" } } end)
        teardown(function() if srv then srv:stop() end end)

        local function with_fields(n)
            local lines = { "GET / HTTP/1.1", "Host: x" }
            for i = 1, n - 1 do lines[#lines + 1] = "X-F" .. i .. ": v" end
            return table.concat(lines, "\r\n") .. "\r\n\r\n"
        end

        it("accepts exactly header_fields fields (Host counted)", function()
            assert.are.equal(200, ok_response(srv, with_fields(10)).status)
        end)

        it("answers 431 and closes one field past it", function()
            server.assert_refused(srv, with_fields(11), 431)
        end)
    end)

    describe("target_bytes", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--target-bytes", "1024" } } end)
        teardown(function() if srv then srv:stop() end end)

        local function target_of(n) return "/t?" .. ("a"):rep(n - 3) end

        it("accepts a target of exactly target_bytes", function()
            local r = ok_response(srv, "GET " .. target_of(1024) .. " HTTP/1.1\r\nHost: x\r\n\r\n")
            assert.are.equal(200, r.status)
            assert.are.equal("t", r.body)
        end)

        it("answers 414 and closes one byte past it", function()
            server.assert_refused(srv, "GET " .. target_of(1025) .. " HTTP/1.1\r\nHost: x\r\n\r\n", 414)
        end)
    end)

    describe("body_bytes", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--limit", "body_bytes=1000" } } end)
        teardown(function() if srv then srv:stop() end end)

        it("accepts a body of exactly body_bytes", function()
            local r = ok_response(srv, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                .. ("b"):rep(1000))
            assert.are.equal("1000", r.body)
        end)

        it("answers 413 and closes one byte past it (Content-Length)", function()
            server.assert_refused(srv, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n"
                .. ("b"):rep(1001), 413)
        end)

        it("answers 413 and closes one byte past it (chunked)", function()
            server.assert_refused(srv, "POST /len HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                .. "3e8\r\n" .. ("b"):rep(1000) .. "\r\n1\r\nb\r\n0\r\n\r\n", 413)
        end)

        it("can be 0: any body gets 413", function()
            local srv0 = server.start { app = APP, args = { "--body-bytes", "0" } }
            local ok, err = pcall(function()
                local r = ok_response(srv0, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                assert.are.equal("0", r.body)
                server.assert_refused(srv0, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb", 413)
            end)
            srv0:stop()
            assert(ok, err)
        end)
    end)

    describe("timeouts", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = {
                "--limit", "header_timeout_ms=300",
                "--limit", "keepalive_timeout_ms=2000",
                "--limit", "body_timeout_ms=300",
            } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("header_timeout: a partial head gets 408 and a close within ~1 s", function()
            local c = srv:raw_conn()
            local t0 = server.now()
            c:send("GET / HTTP/1.1\r\nHost")
            local data, closed = c:read_until_close(2)
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed, "connection still open after 2 s")
            assert.truthy(dt >= 0.25, "closed too early: " .. dt)
            assert.truthy(dt < 1.2, "closed too late: " .. dt)
            local r = server.parse_responses(data)[1]
            assert.truthy(r, "no 408 before the close: " .. string.format("%q", data))
            assert.are.equal(408, r.status)
            assert.are.equal("close", (r.headers.connection or ""):lower())
        end)

        it("header_timeout: an idle new connection is closed silently, defer_accept_s after", function()
            -- TCP_DEFER_ACCEPT (defer_accept_s=1 by default): the kernel hands over a connection
            -- that sends nothing after ~1 s (its SYN-ACK timer); header_timeout_ms runs from there
            local c = srv:raw_conn()
            local t0 = server.now()
            local data, closed = c:read_until_close(4)
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed)
            assert.truthy(dt >= 0.9, "closed before the kernel handed it over: " .. dt)
            assert.truthy(dt < 2.5, "closed too late: " .. dt)
            assert.are.equal("", data)
        end)

        it("defer_accept_s: a request sent a while after the connect is served at once", function()
            local c = srv:raw_conn()
            server.sleep(0.5)
            local t0 = server.now()
            c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            local r = c:read_response { timeout = 2 }
            local dt = server.now() - t0
            c:close()
            assert.are.equal(200, r and r.status)
            assert.truthy(dt < 0.5, "served after " .. dt)
        end)

        it("header_timeout: a head dribbled byte by byte is still cut off", function()
            local c = srv:raw_conn()
            local t0 = server.now()
            local head = "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " .. ("s"):rep(100)
            local i = 1
            while i <= #head and server.now() - t0 < 2 do
                if not c:send(head:sub(i, i)) then break end
                i = i + 1
                c:fill(0.05)
                if c.eof then break end
            end
            local _, closed = c:read_until_close(math.max(0.1, 2 - (server.now() - t0)))
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed, "a slowloris head kept the connection open for 2 s")
            assert.truthy(dt < 1.5, "closed too late: " .. dt)
        end)

        it("keepalive_timeout (not header_timeout) applies between requests", function()
            local c = srv:raw_conn()
            c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert.are.equal(200, assert(c:read_response()).status)
            server.sleep(0.8) -- well past header_timeout, well before keepalive_timeout
            assert.is_true(c:is_open(0), "idle keep-alive connection closed by header_timeout")
            c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            local r = assert(c:read_response())
            assert.are.equal(200, r.status)
            c:close()
        end)

        it("body_timeout: a body that stops arriving closes the connection", function()
            local c = srv:raw_conn()
            local t0 = server.now()
            c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
            local data, closed = c:read_until_close(2)
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed, "connection still open after 2 s")
            assert.truthy(dt < 1.2, "closed too late: " .. dt)
            local r = server.parse_responses(data)[1]
            if r then -- a 408 is fine, an answer to the handler is not
                assert.are.equal(408, r.status)
            end
        end)

        it("body_timeout: a slow but steady body is not cut off", function()
            local c = srv:raw_conn()
            c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n")
            for i = 1, 6 do
                server.sleep(0.15)
                c:send(tostring(i))
            end
            local r = assert(c:read_response())
            assert.are.equal("123456", r.body)
            c:close()
        end)
    end)

    describe("keepalive_timeout", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = { "--keepalive-timeout-ms", "300" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("closes an idle keep-alive connection after a request", function()
            local c = srv:raw_conn()
            c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert.are.equal(200, assert(c:read_response()).status)
            local t0 = server.now()
            local closed, extra = c:wait_closed(2)
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed, "idle keep-alive connection still open after 2 s")
            assert.truthy(dt >= 0.2, "closed too early: " .. dt)
            assert.truthy(dt < 1.2, "closed too late: " .. dt)
            assert.are.equal("", extra)
        end)
    end)

    describe("write_timeout", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = { "--limit", "write_timeout_ms=300" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("drops a connection whose peer stops reading", function()
            local c = srv:raw_conn { rcvbuf = 4096 }
            c:send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            -- the first bytes (building 32 MiB can take a loaded ASan build a second or more)
            assert.truthy(server.wait_until(20, function() return #c.buf > 0 or c:fill(0.1) ~= "" end))
            server.sleep(1.5) -- then read nothing: the server's writes stall
            local t0 = server.now()
            local data, closed = c:read_until_close(5)
            local why = string.format("%d bytes read in %.2f s after the stall, close: %s", #data,
                server.now() - t0, tostring(c.close_reason))
            c:close()
            assert.is_true(closed, "connection still open: " .. why)
            assert.truthy(#data < 32 * 1024 * 1024, "the whole 32 MiB body arrived: no write timeout; " .. why)
        end)
    end)

    describe("defer_accept_s=0", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = {
                "--limit", "header_timeout_ms=300", "--limit", "defer_accept_s=0" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("an idle new connection is closed silently within header_timeout_ms", function()
            local c = srv:raw_conn()
            local t0 = server.now()
            local data, closed = c:read_until_close(2)
            local dt = server.now() - t0
            c:close()
            assert.is_true(closed)
            assert.truthy(dt < 0.85, "closed too late: " .. dt)
            assert.are.equal("", data)
        end)

        it("serves as usual", function()
            local c = srv:raw_conn()
            c:send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local r = c:read_response { timeout = 2 }
            assert.are.equal(200, r and r.status)
            assert.truthy(c:wait_closed(2))
            c:close()
        end)
    end)

    describe("connections", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = { "--limit", "connections=3" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("serves no more than `connections` at once, and serves again once one closes", function()
            -- three clients still sending their heads (idle keep-alive connections would make
            -- room for the 4th: spec/slow_clients_spec.lua)
            local conns = {}
            for i = 1, 3 do
                conns[i] = assert(srv:raw_conn())
                conns[i]:send("GET / HTTP/1.1\r\nHost: x\r\n")
            end
            -- the 4th: refused, closed, 503, or left waiting in the backlog; never served now
            local c4 = srv:raw_conn()
            if c4 then
                c4:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                local r = c4:read_response { timeout = 0.5 }
                assert.falsy(r and r.status == 200, "a 4th connection was served with connections=3")
            end
            conns[1]:close()
            server.sleep(0.2) -- let the server see that close before the next connect
            -- a connection waiting in the backlog may now take the free slot: let it finish
            if c4 then
                local r = c4:read_response { timeout = 1 }
                c4:close()
                if r and r.status == 200 then server.sleep(0.1) end
            end
            local c5 = assert(srv:raw_conn())
            c5:send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local r5 = c5:read_response { timeout = 2 }
            c5:close()
            assert.truthy(r5 and r5.status == 200, "no service after a slot was freed")
            for i = 2, 3 do conns[i]:close() end
        end)
    end)
end)
