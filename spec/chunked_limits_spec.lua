-- spec/chunked_limits_spec.lua: body_bytes against chunked request bodies (issue 8, item 6).
-- body_bytes bounds the sum of the chunk sizes, as it bounds a Content-Length: a chunk-size line
-- that takes the sum past it is answered 413, with Connection: close, as soon as its CRLF is
-- read, before any of that chunk's data (a client does not get to send 8 MiB first). The
-- connection closes because the rest of the body will not be read: its framing is unknown.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.post("/echo", function(req) return req:body() end)
k.post("/len", function(req) return tostring(#req:body()) end)
k.post("/nobody", function(req) return "not read" end)
k.post("/wait", function(req)
    k.log.info("wait handler: started")
    local ok, e = pcall(req.body, req)
    k.log.info("wait handler: body " .. (ok and "read" or tostring(e)))
    if not ok then error(e, 0) end -- the engine answered already: end as aborted
    return "unreachable"
end)
]]

local HEAD = "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"

local function head(path)
    return HEAD:format(path)
end

describe("chunked bodies and body_bytes", function()
    describe("at the default body_bytes (8 MiB)", function()
        local srv
        setup(function()
            srv = server.start { app = APP, tls = false }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        it("answers 413 at once to a size line of 0x800001 with no data, and closes", function()
            local t0 = server.now()
            -- the read waits up to 20 s: before the fix no answer came until body_timeout_ms
            local r = server.assert_refused(srv, head("/echo") .. "800001\r\n", 413, { timeout = 20 })
            assert.truthy(r.body:match("too large"), r.body)
            assert.truthy(server.now() - t0 < 10, "the 413 took " .. (server.now() - t0) .. " s")
        end)

        it("answers 413 when the size line comes after the handler began waiting for the body", function()
            local from = srv:log_size()
            local c = srv:raw_conn()
            c:send(head("/wait"))
            assert.truthy(srv:wait_log("wait handler: started", 10, from))
            c:send("800001\r\n")
            local r = c:read_response { timeout = 20 }
            assert.truthy(r, "no response")
            assert.are.equal(413, r.status)
            assert.are.equal("close", r.headers.connection)
            assert.is_true(c:wait_closed(10))
            c:close()
            -- the handler's req:body() learns the body is too large, as for a Content-Length
            assert.truthy(srv:wait_log("wait handler: body .*too large", 10, from), srv:log())
        end)

        it("answers 413 to a handler that does not read the body, when the size line is at hand", function()
            server.assert_refused(srv, head("/nobody") .. "ffffffffffffffff\r\n", 413, { timeout = 20 })
        end)

        it("closes without another answer when the size line comes after the response", function()
            local c = srv:raw_conn()
            c:send(head("/nobody"))
            local r = c:read_response { timeout = 20 }
            assert.truthy(r, "no response")
            assert.are.equal(200, r.status)
            assert.are.equal("not read", r.body)
            c:send("800001\r\n")
            local closed, extra = c:wait_closed(20)
            c:close()
            assert.is_true(closed)
            assert.are.equal("", extra)
        end)

        it("takes a size line of exactly 8 MiB and waits for the data", function()
            local c = srv:raw_conn()
            c:send(head("/len") .. "800000\r\n")
            assert.is_true(c:is_open(1), "closed: " .. c.buf)
            assert.are.equal("", c.buf)
            c:close()
        end)
    end)

    describe("with --body-bytes 1000", function()
        local srv
        setup(function()
            srv = server.start { app = APP, tls = false, args = { "--body-bytes", "1000" } }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        local x500 = ("x"):rep(500)

        it("answers 413 at the size line of the chunk that crosses it, before its data", function()
            -- 500 + 500 = 1000 is within; the next chunk of 1 is not, and its byte never comes
            local r = server.assert_refused(srv, head("/echo") .. "1f4\r\n" .. x500 .. "\r\n1f4\r\n" .. x500
                .. "\r\n1\r\n", 413, { timeout = 20 })
            assert.truthy(r.body:match("too large"), r.body)
        end)

        it("answers 413 when many small chunks cross it", function()
            local body = ("a\r\n0123456789\r\n"):rep(100) -- 100 x 10 = 1000
            server.assert_refused(srv, head("/echo") .. body .. "b\r\n", 413, { timeout = 20 })
        end)

        it("answers 413 when the sizes cross it across several writes", function()
            local c = srv:raw_conn()
            c:send(head("/echo"))
            c:send("200\r\n" .. ("y"):rep(512) .. "\r\n")
            server.sleep(0.05)
            c:send("200\r\n") -- 512 + 512 > 1000: the data of this chunk is never sent
            local r = c:read_response { timeout = 20 }
            assert.truthy(r, "no response")
            assert.are.equal(413, r.status)
            assert.is_true(c:wait_closed(10))
            c:close()
        end)

        it("reads chunks that add up to exactly body_bytes", function()
            local data = srv:raw(head("/len"):gsub("\r\n\r\n$", "\r\nConnection: close\r\n\r\n")
                .. "1f4\r\n" .. x500 .. "\r\n1f4\r\n" .. x500 .. "\r\n0\r\n\r\n", { timeout = 20 })
            local r = server.parse_responses(data)[1]
            assert.truthy(r, data)
            assert.are.equal(200, r.status)
            assert.are.equal("1000", r.body)
        end)
    end)
end)
