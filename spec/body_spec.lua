-- Request bodies: Content-Length and chunked (extensions, trailers), req:json(),
-- Expect: 100-continue, body_bytes (413 and close), empty bodies.
--
-- Decision: req:json() on a body that is not JSON raises an error that the engine turns into
-- 400 "invalid JSON" (a client error: no [error] line in the log), not a 500.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
k.post("/echo", function(req) return req:body() end)
k.put("/echo", function(req) return req:body() end)
k.post("/len", function(req) return tostring(#req:body()) end)
k.post("/twice", function(req)
    local a = req:body()
    local b = req:body()
    return tostring(a == b) .. ":" .. a
end)
k.post("/json", function(req)
    local t = req:json()
    return { got = t }
end)
k.post("/nobody", function(req) return "not read" end)
k.get("/hello", function() return "hello" end)
]]

local function json(r)
    local ok, t = pcall(cjson.decode, r.body)
    assert(ok, "body is not JSON: " .. tostring(r.body))
    return t
end

describe("request bodies", function()
    local srv
    setup(function()
        srv = server.start { app = APP, args = { "--limit", "body_bytes=1024" } }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function post(path, body, headers, method)
                return srv:request { proto = proto, method = method or "POST", path = path, body = body,
                    headers = headers }
            end

            it("reads a Content-Length body", function()
                local r = post("/echo", "hello world")
                assert.are.equal(200, r.status)
                assert.are.equal("hello world", r.body)
                r = post("/echo", "put body", nil, "PUT")
                assert.are.equal("put body", r.body)
            end)

            it("keeps binary bytes intact", function()
                local bin = "\0\1\2\255\r\n\r\n\0end"
                local r = post("/echo", bin)
                assert.are.equal(200, r.status)
                assert.are.equal(bin, r.body)
            end)

            it("reads a body of exactly body_bytes", function()
                local body = ("b"):rep(1024)
                local r = post("/echo", body)
                assert.are.equal(200, r.status)
                assert.are.equal(body, r.body)
            end)

            it("reads a chunked body sent by the client", function()
                local r = post("/echo", "chunked via curl", { ["Transfer-Encoding"] = "chunked" })
                assert.are.equal(200, r.status)
                assert.are.equal("chunked via curl", r.body)
            end)

            it("returns the same body when req:body() is called twice", function()
                local r = post("/twice", "same")
                assert.are.equal("true:same", r.body)
            end)

            it("decodes JSON with req:json()", function()
                local r = post("/json", '{"a":1,"b":[1,2],"c":{"d":"e"}}',
                    { ["Content-Type"] = "application/json" })
                assert.are.equal(200, r.status)
                assert.are.same({ got = { a = 1, b = { 1, 2 }, c = { d = "e" } } }, json(r))
            end)

            it("answers 400 invalid JSON for a body that is not JSON, without an [error] line", function()
                local mark = srv:log_size()
                local r = post("/json", '{"a":1', { ["Content-Type"] = "application/json" })
                assert.are.equal(400, r.status)
                assert.truthy(r.body:lower():find("invalid json", 1, true), r.body)
                server.sleep(0.05)
                assert.falsy(srv:log():sub(mark + 1):find("[error]", 1, true), srv:log():sub(mark + 1))
            end)

            it("reads an empty body", function()
                local r = post("/len", "")
                assert.are.equal(200, r.status)
                assert.are.equal("0", r.body)
            end)

            it("answers 413 for a body over body_bytes", function()
                local r = post("/echo", ("x"):rep(1025))
                assert.are.equal(413, r.status)
            end)
        end)
    end)

    describe("over a raw socket", function()
        it("reads a chunked body with extensions and trailers", function()
            local data = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                .. "Connection: close\r\n\r\n"
                .. "5;ext=1\r\nhello\r\n"
                .. "6;name=\"quoted value\";flag\r\n world\r\n"
                .. "A\r\n0123456789\r\n"
                .. "a\r\nabcdefghij\r\n"
                .. "0\r\nX-Trailer: yes\r\nX-Other: 2\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("hello world0123456789abcdefghij", r.body)
        end)

        it("reads a chunked body that arrives in pieces", function()
            local c = srv:raw_conn()
            local parts = { "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                "3", "\r\nab", "c\r", "\n4\r\ndefg\r\n", "0\r", "\n\r\n" }
            for _, p in ipairs(parts) do
                c:send(p)
                server.sleep(0.02)
            end
            local r = assert(c:read_response())
            assert.are.equal(200, r.status)
            assert.are.equal("abcdefg", r.body)
            c:close()
        end)

        it("reads a Content-Length body that arrives in pieces", function()
            local c = srv:raw_conn()
            c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
            server.sleep(0.05)
            c:send("56789")
            local r = assert(c:read_response())
            assert.are.equal("0123456789", r.body)
            c:close()
        end)

        it("treats a POST without Content-Length or Transfer-Encoding as an empty body", function()
            local data = srv:raw("POST /len HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("0", r.body)
        end)

        it("reads Content-Length: 0 and keeps the connection", function()
            local c = srv:raw_conn()
            c:send("POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            local r = assert(c:read_response())
            assert.are.equal("0", r.body)
            c:send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            r = assert(c:read_response())
            assert.are.equal("hello", r.body)
            c:close()
        end)

        it("skips an unread body to reach the next pipelined request", function()
            local data = srv:raw("POST /nobody HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde"
                .. "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local list = server.parse_responses(data)
            assert.are.equal(2, #list, data)
            assert.are.equal("not read", list[1].body)
            assert.are.equal("hello", list[2].body)
        end)

        describe("Expect: 100-continue", function()
            it("sends 100 Continue once the handler reads, then the final response", function()
                local c = srv:raw_conn()
                c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
                local interim = assert(c:read_response { timeout = 2 })
                assert.are.equal(100, interim.status)
                assert.are.equal("HTTP/1.1 100 Continue", interim.status_line)
                c:send("hello")
                local r = assert(c:read_response())
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                -- the connection is still good
                c:send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
                r = assert(c:read_response())
                assert.are.equal("hello", r.body)
                c:close()
            end)

            it("accepts the expectation token case-insensitively", function()
                local c = srv:raw_conn()
                c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-Continue\r\n\r\n")
                local interim = assert(c:read_response { timeout = 2 })
                assert.are.equal(100, interim.status)
                c:send("ok")
                local r = assert(c:read_response())
                assert.are.equal("ok", r.body)
                c:close()
            end)

            it("sends no 100 Continue when the handler answers without reading", function()
                local c = srv:raw_conn()
                c:send("POST /nobody HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
                local r = assert(c:read_response { timeout = 2 })
                assert.are.equal(200, r.status)
                assert.are.equal("not read", r.body)
                c:close()
            end)

            it("answers 413 instead of 100 Continue when the declared length is over body_bytes", function()
                local c = srv:raw_conn()
                c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
                local r = assert(c:read_response { timeout = 2 })
                assert.are.equal(413, r.status)
                assert.is_true((c:wait_closed(2)))
                c:close()
            end)

            it("is ignored in an HTTP/1.0 request (RFC 9110 §10.1.1): no 1xx to a 1.0 client", function()
                local data = srv:raw("POST /echo HTTP/1.0\r\nHost: x\r\nContent-Length: 5\r\n"
                    .. "Expect: 100-continue\r\n\r\nhello")
                local r = server.parse_responses(data)[1]
                assert.truthy(r, data)
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
            end)
        end)

        describe("past body_bytes", function()
            it("answers 413 and closes for a declared Content-Length", function()
                server.assert_refused(srv, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n"
                    .. ("x"):rep(1025), 413)
            end)

            it("answers 413 and closes when the Content-Length is declared and no body is sent", function()
                server.assert_refused(srv, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n", 413)
            end)

            it("answers 413 and closes for a chunked body that grows past it", function()
                local chunk = ("y"):rep(300)
                local body = ""
                for _ = 1, 4 do body = body .. "12c\r\n" .. chunk .. "\r\n" end
                server.assert_refused(srv, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .. body .. "0\r\n\r\n", 413)
            end)

            it("answers 413 for a chunked body growing past it across several writes", function()
                local c = srv:raw_conn()
                c:send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                local chunk = "c8\r\n" .. ("z"):rep(200) .. "\r\n"
                for _ = 1, 6 do
                    if not c:send(chunk) then break end
                    server.sleep(0.01)
                end
                local data, closed = c:read_until_close(2)
                local r = server.parse_responses(data)[1]
                assert.truthy(r, data)
                assert.are.equal(413, r.status)
                assert.is_true(closed)
                c:close()
            end)

            it("accepts a chunked body of exactly body_bytes", function()
                local data = srv:raw("POST /len HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    .. "Connection: close\r\n\r\n400\r\n" .. ("q"):rep(1024) .. "\r\n0\r\n\r\n")
                local r = server.parse_responses(data)[1]
                assert.truthy(r, data)
                assert.are.equal(200, r.status)
                assert.are.equal("1024", r.body)
            end)
        end)
    end)
end)

describe("request bodies with the default body_bytes (8 MiB)", function()
    local srv
    setup(function()
        srv = server.start { app = APP }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    it("reads a 2 MiB body", function()
        local body = ("0123456789abcdef"):rep(131072)
        local r = srv:request { method = "POST", path = "/len", body = body }
        assert.are.equal(200, r.status)
        assert.are.equal(tostring(#body), r.body)
    end)

    it("answers 413 past 8 MiB", function()
        server.assert_refused(srv, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8388609\r\n\r\n", 413)
    end)
end)
