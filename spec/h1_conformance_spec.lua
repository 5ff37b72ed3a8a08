-- HTTP/1.1 conformance over raw sockets (RFC 9112): keep-alive, pipelining, Connection: close,
-- HTTP/1.0, absolute-form, leading CRLF, and every malformed or ambiguous request the engine
-- must refuse with a given status AND close the connection (request smuggling included).
-- Peer garbage must never produce an [error] log line: srv:stop() fails the block if it does.
--
-- RFC choices beyond the contract's list (noted in the report):
-- * two Host fields -> 400 (RFC 9112 §3.2 "MUST respond with a 400").
-- * Transfer-Encoding: gzip, chunked -> 501 (unknown coding, RFC 9112 §6.1).
-- * an overflowing chunk size -> 400 or 413 (either is a refusal).
-- * a malformed HTTP-version (HTTP/1.x, FOO/1.1) and a request-target with a space -> 400.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/p", function(req)
    return "p:" .. req.path .. (req.query and ("?" .. req.query) or "")
end)
k.get("/n/:n", function(req) return "n" .. req.params.n end)
k.post("/echo", function(req) return req:body() end)
k.get("/v", function(req) return req.version end)
k.get("/smuggled", function() return "SMUGGLED" end)
k.post("/smuggled", function() return "SMUGGLED" end)
k.post("/early", function() return "early" end) -- answers without reading the body
]]

local CRLF = "\r\n"

local function get(path, extra)
    return "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n" .. (extra or "") .. "\r\n"
end

describe("HTTP/1.1", function()
    local srv
    setup(function()
        srv = server.start { app = APP }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    describe("connection management", function()
        it("keeps a connection alive for a second request", function()
            local c = srv:raw_conn()
            c:send(get("/n/1"))
            local r1 = assert(c:read_response())
            assert.are.equal(200, r1.status)
            assert.are.equal("n1", r1.body)
            assert.are.equal("HTTP/1.1", r1.status_line:sub(1, 8))
            assert.are_not.equal("close", (r1.headers.connection or ""):lower())
            assert.is_true(c:is_open(0.05), "server closed a keep-alive connection")
            c:send(get("/n/2"))
            local r2 = assert(c:read_response())
            assert.are.equal("n2", r2.body)
            c:close()
        end)

        it("answers three pipelined requests in order", function()
            local data, closed = srv:raw(get("/n/1") .. get("/n/2") .. get("/n/3", "Connection: close\r\n"))
            local list = server.parse_responses(data)
            assert.are.equal(3, #list, data)
            for i = 1, 3 do
                assert.are.equal(200, list[i].status)
                assert.are.equal("n" .. i, list[i].body)
            end
            assert.is_true(closed)
        end)

        it("answers 50 pipelined requests in order", function()
            local reqs = {}
            for i = 1, 50 do reqs[i] = get("/n/" .. i, i == 50 and "Connection: close\r\n" or nil) end
            local data = srv:raw(table.concat(reqs), { timeout = 5 })
            local list = server.parse_responses(data)
            assert.are.equal(50, #list)
            for i = 1, 50 do assert.are.equal("n" .. i, list[i].body) end
        end)

        it("answers pipelined requests with bodies in order", function()
            local data = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                .. "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n"
                .. get("/n/3", "Connection: close\r\n"))
            local list = server.parse_responses(data)
            assert.are.equal(3, #list, data)
            assert.are.equal("abc", list[1].body)
            assert.are.equal("de", list[2].body)
            assert.are.equal("n3", list[3].body)
        end)

        it("parses a request sent one byte at a time", function()
            local c = srv:raw_conn()
            local req = get("/p?q=1", "Connection: close\r\n")
            for i = 1, #req do
                c:send(req:sub(i, i))
                server.sleep(0.001)
            end
            local r = assert(c:read_response())
            assert.are.equal("p:/p?q=1", r.body)
            c:close()
        end)

        it("honours Connection: close (header in the answer, then close)", function()
            local c = srv:raw_conn()
            c:send(get("/n/1", "Connection: close\r\n"))
            local r = assert(c:read_response())
            assert.are.equal(200, r.status)
            assert.are.equal("close", (r.headers.connection or ""):lower())
            local closed, extra = c:wait_closed(2)
            assert.is_true(closed, "server kept the connection open after Connection: close")
            assert.are.equal("", extra)
            c:close()
        end)

        -- After a Connection: close answer with nothing left to read, the socket is closed, not
        -- shut down for writing and drained (lingering): a byte the client sends after our FIN
        -- then finds no socket and is answered with RST, so the client's next send fails.
        it("closes at once after a Connection: close answer when nothing is left to read", function()
            local c = srv:raw_conn()
            c:send(get("/n/1", "Connection: close\r\n"))
            local r = assert(c:read_response())
            assert.are.equal("n1", r.body)
            assert.is_true((c:wait_closed(2)), "no FIN after the answer")
            assert.is_truthy(c.sock:send("x"))
            server.sleep(0.05)
            local ok, err = c.sock:send("y")
            assert.is_nil(ok, "the server still read after its FIN (a lingering close)")
            assert.truthy(err == "closed" or err:find("reset"), err)
            c:close()
        end)

        -- An answer that left the request's body unread still lingers: the client may be
        -- sending that body, and an RST could destroy the answer before the client reads it.
        it("lingers after a Connection: close answer that left the body unread", function()
            local c = srv:raw_conn()
            c:send("POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                .. "Connection: close\r\n\r\n" .. ("b"):rep(1000))
            local r = assert(c:read_response())
            assert.are.equal("early", r.body)
            assert.is_true((c:wait_closed(2)), "no FIN after the answer")
            assert.is_truthy(c.sock:send(("b"):rep(1000)))
            server.sleep(0.05)
            assert.is_truthy(c.sock:send(("b"):rep(1000)), "the rest of the body was answered with RST")
            c:close()
        end)

        -- A client that sends its request and shuts down its sending side still gets the
        -- answer, then the server's FIN (keep-alive or not).
        for _, extra in ipairs { "", "Connection: close\r\n" } do
            it("answers a request whose client half-closed right after it" .. (extra == "" and "" or " (Connection: close)"), function()
                local c = srv:raw_conn()
                c:send(get("/n/7", extra))
                c.sock:shutdown("send")
                local r = assert(c:read_response())
                assert.are.equal(200, r.status)
                assert.are.equal("n7", r.body)
                assert.is_true((c:wait_closed(2)), "no FIN after the answer")
                c:close()
            end)
        end

        it("honours close among other Connection options, case-insensitively", function()
            local data, closed = srv:raw(get("/n/1", "Connection: keep-alive, CLOSE\r\n"))
            assert.are.equal(200, server.parse_responses(data)[1].status)
            assert.is_true(closed)
        end)

        it("does not answer requests pipelined after Connection: close", function()
            local data, closed = srv:raw(get("/n/1", "Connection: close\r\n") .. get("/n/2"))
            assert.are.equal(1, server.count_status_lines(data), data)
            assert.is_true(closed)
        end)

        it("closes an HTTP/1.0 connection by default", function()
            local data, closed = srv:raw("GET /v HTTP/1.0\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("1.0", r.body)
            assert.is_true(closed, "HTTP/1.0 without keep-alive must close")
        end)

        it("keeps an HTTP/1.0 connection alive with Connection: keep-alive", function()
            local c = srv:raw_conn()
            c:send("GET /n/1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            local r = assert(c:read_response())
            assert.are.equal("n1", r.body)
            assert.are.equal("keep-alive", (r.headers.connection or ""):lower())
            assert.is_true(c:is_open(0.05))
            c:send("GET /n/2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            r = assert(c:read_response())
            assert.are.equal("n2", r.body)
            c:send("GET /n/3 HTTP/1.0\r\n\r\n")
            r = assert(c:read_response())
            assert.are.equal("n3", r.body)
            assert.is_true((c:wait_closed(2)))
            c:close()
        end)

        it("accepts an absolute-form target", function()
            local data = srv:raw("GET http://x/p?q=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("p:/p?q=1", r.body)
        end)

        it("accepts an absolute-form target with a port", function()
            local data = srv:raw("GET http://example.com:8080/p HTTP/1.1\r\nHost: example.com:8080\r\n"
                .. "Connection: close\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal("p:/p", r.body)
        end)

        it("ignores a CRLF before the request line (RFC 9112 §2.2)", function()
            local data = srv:raw("\r\n" .. get("/p", "Connection: close\r\n"))
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("p:/p", r.body)
        end)

        it("ignores a CRLF between pipelined requests", function()
            local data = srv:raw(get("/n/1") .. "\r\n" .. get("/n/2", "Connection: close\r\n"))
            local list = server.parse_responses(data)
            assert.are.equal(2, #list, data)
            assert.are.equal("n2", list[2].body)
        end)

        it("accepts optional whitespace around field values", function()
            local data = srv:raw("GET /p HTTP/1.1\r\nHost:x\r\nX-A: \t spaced \t \r\nConnection: close\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
        end)

        it("accepts obs-text (bytes 0x80-0xFF) in a field value (RFC 9110 §5.5)", function()
            local data = srv:raw("GET /p HTTP/1.1\r\nHost: x\r\nX-Latin: caf\233 \255\r\nConnection: close\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
        end)

        it("takes transfer-coding names case-insensitively (RFC 9112 §7)", function()
            local data = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n"
                .. "Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("abc", r.body)
        end)

        it("accepts a Content-Length with leading zeros (1*DIGIT)", function()
            local data = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 003\r\n"
                .. "Connection: close\r\n\r\nabc")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("abc", r.body)
        end)

        it("accepts identical duplicate Content-Length fields or refuses them with 400", function()
            -- RFC 9112 §6.3 allows either; both must leave no second message behind.
            local data, closed = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                .. "Content-Length: 5\r\nConnection: close\r\n\r\nhello")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.truthy(r.status == 200 or r.status == 400, r.status_line)
            if r.status == 200 then assert.are.equal("hello", r.body) end
            assert.is_true(closed)
        end)
    end)

    describe("refuses with the status and closes", function()
        local POST_CL = "POST /echo HTTP/1.1\r\nHost: x\r\n"
        local cases = {
            { "Content-Length with Transfer-Encoding", 400,
                POST_CL .. "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" },
            { "Transfer-Encoding with Content-Length", 400,
                POST_CL .. "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" },
            { "two differing Content-Length fields", 400,
                POST_CL .. "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" },
            { "a Content-Length list with differing values", 400,
                POST_CL .. "Content-Length: 5, 6\r\n\r\nhello!" },
            { "a non-numeric Content-Length", 400, POST_CL .. "Content-Length: abc\r\n\r\n" },
            { "a negative Content-Length", 400, POST_CL .. "Content-Length: -1\r\n\r\n" },
            { "a signed Content-Length", 400, POST_CL .. "Content-Length: +5\r\n\r\nhello" },
            { "a hexadecimal Content-Length", 400, POST_CL .. "Content-Length: 0x5\r\n\r\nhello" },
            { "an empty Content-Length", 400, POST_CL .. "Content-Length: \r\n\r\n" },
            { "a bad chunk size", 400, POST_CL .. "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n" },
            { "a chunk size with 0x", 400, POST_CL .. "Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n" },
            { "a negative chunk size", 400, POST_CL .. "Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n" },
            { "a chunk not followed by CRLF", 400,
                POST_CL .. "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n" },
            { "an overflowing chunk size", { 400, 413 },
                POST_CL .. "Transfer-Encoding: chunked\r\n\r\n10000000000000000000000000005\r\nhello\r\n0\r\n\r\n" },
            { "obs-fold (continuation line)", 400, "GET /p HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n" },
            { "obs-fold with a tab", 400, "GET /p HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n" },
            { "obs-fold on the first field line", 400, "GET /p HTTP/1.1\r\n Host: x\r\n\r\n" },
            { "a bare CR in a field value", 400, "GET /p HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n" },
            { "a bare CR in the request line", 400, "GET /p\rHTTP/1.1\r\nHost: x\r\n\r\n" },
            { "a bare CR ending a field line", 400, "GET /p HTTP/1.1\r\nHost: x\rX-A: b\r\n\r\n" },
            { "bare LF line endings", 400, "GET /p HTTP/1.1\nHost: x\n\n" },
            { "a bare LF ending one field line", 400, "GET /p HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n" },
            { "a bare LF ending the request line", 400, "GET /p HTTP/1.1\nHost: x\r\n\r\n" },
            { "an invalid token char in the method", 400, "G(T /p HTTP/1.1\r\nHost: x\r\n\r\n" },
            { "a non-ASCII byte in the method", 400, "G\200T /p HTTP/1.1\r\nHost: x\r\n\r\n" },
            { "an invalid token char in a field name", 400, "GET /p HTTP/1.1\r\nHost: x\r\nBad@Name: v\r\n\r\n" },
            { "a space inside a field name", 400, "GET /p HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n" },
            { "an empty field name", 400, "GET /p HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n" },
            { "a field line without a colon", 400, "GET /p HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n" },
            { "whitespace before the colon", 400, "GET /p HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n" },
            { "a tab before the colon", 400, "GET /p HTTP/1.1\r\nHost: x\r\nX-A\t: b\r\n\r\n" },
            { "whitespace before the colon of Host", 400, "GET /p HTTP/1.1\r\nHost : x\r\n\r\n" },
            { "a request-target with a space", 400, "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n" },
            { "a malformed HTTP-version", 400, "GET /p HTTP/1.x\r\nHost: x\r\n\r\n" },
            { "a protocol other than HTTP", 400, "GET /p FOO/1.1\r\nHost: x\r\n\r\n" },
            { "a request line without a version", 400, "GET /p\r\nHost: x\r\n\r\n" },
            { "whitespace before the request line", 400, " GET /p HTTP/1.1\r\nHost: x\r\n\r\n" },
            { "a lower-case HTTP-name (case-sensitive, RFC 9112 §2.3)", 400, "GET /p http/1.1\r\nHost: x\r\n\r\n" },
            { "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1: faulty framing)", 400,
                "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" },
            { "HTTP/2.0 in an h1 request line", 505, "GET /p HTTP/2.0\r\nHost: x\r\n\r\n" },
            { "HTTP/3.0 in an h1 request line", 505, "GET /p HTTP/3.0\r\nHost: x\r\n\r\n" },
            { "an HTTP/1.1 request without Host", 400, "GET /p HTTP/1.1\r\nX-A: b\r\n\r\n" },
            { "two Host fields", 400, "GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" },
            { "an Expect other than 100-continue", 417,
                POST_CL .. "Content-Length: 5\r\nExpect: something-else\r\n\r\nhello" },
            -- RFC 9112 §6.3 ¶4 (MUST): chunked not final in a request -> 400, which beats the
            -- 501 of §6.1 (SHOULD) for an unknown coding; so gzip alone is 400, gzip, chunked 501.
            { "Transfer-Encoding: gzip (chunked not final)", 400, POST_CL .. "Transfer-Encoding: gzip\r\n\r\n" },
            { "Transfer-Encoding: gzip, chunked", 501,
                POST_CL .. "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" },
            { "a request-target longer than target_bytes (8192)", 414,
                "GET /p?" .. ("a"):rep(9000) .. " HTTP/1.1\r\nHost: x\r\n\r\n" },
            { "a head larger than header_bytes (16384)", 431,
                "GET /p HTTP/1.1\r\nHost: x\r\nX-Big: " .. ("b"):rep(17000) .. "\r\n\r\n" },
            { "more header fields than header_fields (100)", 431,
                "GET /p HTTP/1.1\r\nHost: x\r\n" .. ("X-F: v\r\n"):rep(120) .. "\r\n" },
            { "a body larger than body_bytes (8 MiB)", 413,
                POST_CL .. "Content-Length: 9000000\r\n\r\n" },
            { "binary garbage", 400, "\0\1\2\3\4\5\6\7\r\n\r\n" },
        }
        for _, case in ipairs(cases) do
            local name, code, bytes = case[1], case[2], case[3]
            local label = type(code) == "table" and table.concat(code, "/") or tostring(code)
            it(label .. " for " .. name, function()
                server.assert_refused(srv, bytes, code)
            end)
        end
    end)

    describe("request smuggling", function()
        local function one_answer(bytes)
            local data, closed = srv:raw(bytes)
            assert.is_true(server.count_status_lines(data) <= 1, "two answers to one connection:\n" .. data)
            assert.falsy(data:find("SMUGGLED", 1, true), "the smuggled request was answered:\n" .. data)
            local r = server.parse_responses(data)[1]
            assert.truthy(r, "no answer at all: " .. data)
            assert.truthy(r.status >= 400, r.status_line)
            assert.is_true(closed)
            return r
        end

        it("CL: 5 with TE: chunked never gives two answers", function()
            local r = one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                .. "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
            assert.are.equal(400, r.status)
        end)

        it("TE: chunked with a CL covering a smuggled request never gives two answers", function()
            local smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
            local chunked = string.format("%x", #smuggled) .. "\r\n" .. smuggled .. "\r\n0\r\n\r\n"
            local r = one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                .. "Content-Length: 4\r\n\r\n" .. chunked)
            assert.are.equal(400, r.status)
        end)

        it("an obfuscated Transfer-Encoding (space before the colon) never gives two answers", function()
            one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding : chunked\r\n\r\n"
                .. "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
        end)

        it("Transfer-Encoding: xchunked with CL never gives two answers", function()
            one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\n"
                .. "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
        end)

        it("differing duplicate CL never gives two answers", function()
            local smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
            local r = one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: "
                .. #smuggled .. "\r\n\r\n" .. smuggled)
            assert.are.equal(400, r.status)
        end)

        it("a chunk-extension with a bare LF never gives two answers", function()
            one_answer("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                .. "2;\n" .. "xx\r\n45\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n0\r\n\r\n")
        end)
    end)

    it("logged no [error] line for any of that peer garbage", function()
        server.sleep(0.05)
        assert.are.same({}, srv:unexpected_errors())
    end)
end)

describe("HTTP/1.1 garbage that never ends a head", function()
    -- The parser reports a bad line once the head ends or overflows (documented in
    -- kh_h1_parse.c), so bytes with no line end are cut by header_timeout.
    local srv
    setup(function()
        srv = server.start { app = APP, args = { "--limit", "header_timeout_ms=300" } }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    it("a TLS ClientHello on the plaintext port gets 400 at once and the close", function()
        -- "at once": long before a header_timeout of 10 s (against this describe's 300 ms, the
        -- bound of 0.5 s it had was one round trip at load 20)
        local srv10 = server.start { app = APP, tls = false, args = { "--limit", "header_timeout_ms=10000" } }
        local hello = "\22\3\1\0\165\1\0\0\161\3\3" .. ("\0"):rep(32) .. "\0\0\2\0\47\1\0"
        local t0 = server.now()
        local data, closed = srv10:raw(hello, { timeout = 8 })
        local took = server.now() - t0
        srv10:stop()
        assert.is_true(closed, "still open after 8 s")
        assert.truthy(took < 5, "took " .. took .. " s")
        local r = server.parse_responses(data)[1]
        assert.truthy(r, data)
        assert.are.equal(400, r.status)
    end)

    it("logged no [error] line", function()
        assert.are.same({}, srv:unexpected_errors())
    end)
end)
