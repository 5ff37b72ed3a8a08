-- spec/backpressure_spec.lua: HTTP/1.1 output backpressure (issue 9, item 2).
-- A connection that pipelines many requests for large responses and reads nothing must not make
-- the server queue every response: reading (and parsing the next pipelined request) stops while
-- the connection has more than h1_out_high_water bytes queued for the socket, and resumes as the
-- queue drains, so the pipelined requests are still all answered, in order, once the client reads.
local server = require "spec.helpers.server"

local MIB = 1024 * 1024

local APP = [[
local k = require "khamsin"
local big = ("x"):rep(1024 * 1024)
k.get("/", function() return "ok" end)
k.get("/big", function() return big end)
-- /n/7: 1 MiB that starts with "<7>", to check the order of the answers
k.get("/n/:i", function(req) local h = "<" .. req.params.i .. ">" return h .. big:sub(#h + 1) end)
]]

-- VmRSS of the server process, in bytes.
local function rss(srv)
    local s = server.read_file("/proc/" .. srv.pid .. "/status")
    assert(s, "cannot read /proc/" .. tostring(srv.pid) .. "/status")
    return tonumber(s:match("VmRSS:%s*(%d+) kB")) * 1024
end

-- Reads n Content-Length responses from c. Chunks are kept in a table and joined once per
-- response: a 1 MiB body grown 8 KiB at a time (the small receive buffer) would be copied
-- hundreds of times. Returns the parsed responses (fewer on timeout or close).
local function read_responses(c, n, timeout)
    local socket = require "socket"
    local out, parts, got, need = {}, { c.buf }, #c.buf, nil
    c.buf = ""
    local deadline = server.now() + timeout
    while #out < n do
        if not need then
            local acc = table.concat(parts)
            parts = { acc }
            local e = acc:find("\r\n\r\n", 1, true)
            if e then
                local len = acc:sub(1, e):lower():match("\ncontent%-length: *(%d+)")
                need = e + 3 + assert(tonumber(len), "no content-length: " .. acc:sub(1, e))
            end
        end
        if need and got >= need then
            local acc = table.concat(parts)
            out[#out + 1] = assert(server.parse_response(acc:sub(1, need), { closed = false }))
            acc = acc:sub(need + 1)
            parts, got, need = { acc }, #acc, nil
        else
            if server.now() > deadline then break end
            socket.select({ c.sock }, nil, 0.2)
            c.sock:settimeout(0)
            local data, err, partial = c.sock:receive(65536)
            data = data or partial or ""
            parts[#parts + 1] = data
            got = got + #data
            if err and err ~= "timeout" then break end
        end
    end
    c.buf = table.concat(parts)
    return out
end

local function pipeline(path, n)
    local one = "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"
    return one:rep(n)
end

describe("HTTP/1.1 output backpressure", function()
    local srv
    setup(function()
        -- a short header timeout: a connection whose pipelined requests were all answered is
        -- idle (keepalive_timeout_ms), not waiting for a head
        srv = server.start { app = APP, tls = false, args = { "--limit", "header_timeout_ms=1000" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    it("keeps memory bounded for 1,000 pipelined 1 MiB responses the client never reads", function()
        -- warm up: the body string, the allocator's arenas, one 1 MiB response through out
        for _ = 1, 3 do assert.are.equal(200, srv:request { path = "/big" }.status) end
        local before = rss(srv)
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        assert(c:send(pipeline("/big", 1000)))
        -- let the server do whatever it would do with them (before the fix: all 1,000 at once)
        local peak, t0 = before, server.now()
        while server.now() - t0 < 3 do
            peak = math.max(peak, rss(srv))
            server.sleep(0.05)
        end
        -- the loop is not stuck in that connection: another client is answered at once
        local t1 = server.now()
        assert.are.equal("ok", srv:request { path = "/" }.body)
        local answer_s = server.now() - t1
        peak = math.max(peak, rss(srv))
        local grew = peak - before
        print(string.format("\n  backpressure: VmRSS %.1f MB before, +%.1f MB at the peak "
            .. "(1,000 x GET /big, never read); another client answered in %.3f s",
            before / 1e6, grew / 1e6, answer_s))
        c:close()
        -- 1,000 queued responses would be > 1 GB; one response in flight plus the mark is ~2 MiB
        -- (the bound leaves room for ASan's allocator and quarantine)
        assert.truthy(grew < 64 * MIB, string.format("RSS grew by %.1f MB", grew / 1e6))
        assert.truthy(answer_s < 2, "another client waited " .. answer_s .. " s")
    end)

    it("answers every pipelined request, in order, once the client reads", function()
        local n = 40
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        local req = {}
        for i = 1, n do req[i] = "GET /n/" .. i .. " HTTP/1.1\r\nHost: x\r\n\r\n" end
        assert(c:send(table.concat(req)))
        server.sleep(0.5) -- the server fills the socket and stops parsing
        local rs = read_responses(c, n, 30)
        assert.are.equal(n, #rs, "responses read")
        assert.are.equal("", c.buf)
        for i = 1, n do
            assert.are.equal(200, rs[i].status)
            assert.are.equal(MIB, #rs[i].body)
            assert.are.equal("<" .. i .. ">", rs[i].body:sub(1, #tostring(i) + 2))
        end
        -- and the connection is still good for more, after more than header_timeout_ms
        server.sleep(1.5)
        assert(c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
        local r, err = c:read_response()
        assert(r, "after the pipeline: " .. tostring(err))
        assert.are.equal("ok", r.body)
        c:close()
    end)

    it("answers pipelined requests whose bytes arrive after the pause", function()
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        assert(c:send(pipeline("/big", 4)))
        server.sleep(0.3)
        assert(c:send(pipeline("/", 3))) -- queued behind the paused input
        local rs = read_responses(c, 7, 20)
        assert.are.equal(7, #rs, "responses read")
        for i = 1, 4 do assert.are.equal(MIB, #rs[i].body, "response " .. i) end
        for i = 5, 7 do assert.are.equal("ok", rs[i].body) end
        c:close()
        assert.are.same({}, srv:unexpected_errors())
    end)
end)
