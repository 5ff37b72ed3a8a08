-- Slow and idle clients at the resource limits (issue 9, checked from outside).
--
-- At the `connections` limit, a client that waits in the backlog gets the slot of the oldest
-- idle keep-alive connection (closed as its keepalive_timeout_ms would close it), as nginx
-- reuses keep-alive connections when worker_connections run out ("worker_connections are not
-- enough, reusing connections"). Before: a flood of idle keep-alive connections, one request
-- each, kept every new client out for keepalive_timeout_ms (60 s by default). Connections that
-- are still sending a request are never closed for this: the new client waits for one of them.
--
-- A graceful stop (SIGTERM) lets an answer that is still being written reach a slow reader
-- (within --grace). Before: an HTTP/1.1 keep-alive connection whose answer was complete but
-- still queued for the socket was closed at once, cutting the answer.
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local READER = server.root .. "/spec/helpers/slow_reader.py"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "ok" end)
]]

local GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"

local function served(c, timeout)
    local r = c:read_response { timeout = timeout or 5 }
    return r and r.status == 200
end

describe("at the connections limit", function()
    it("the oldest idle keep-alive connection makes room for a waiting client (1 worker)", function()
        local srv = server.start { app = APP, tls = false, workers = 1,
            args = { "--limit", "connections=4" } }
        local ok, err = pcall(function()
            local conns = {}
            for i = 1, 4 do
                conns[i] = assert(srv:raw_conn())
                conns[i]:send(GET)
                assert.truthy(served(conns[i]), "keep-alive client " .. i .. " not served")
            end
            -- every slot holds an idle keep-alive connection: the 5th client is served anyway,
            -- long before keepalive_timeout_ms (60 s)
            local c5 = assert(srv:raw_conn())
            c5:send(GET)
            assert.truthy(served(c5, 10), "a waiting client was not served while idle keep-alive "
                .. "connections held every slot")
            -- the oldest idle one was closed for it (and not the answered client itself)
            assert.truthy(conns[1]:wait_closed(5), "the oldest idle keep-alive connection is still open")
            assert.truthy(c5:is_open(0.1), "the new client's connection was closed")
            -- it still works as keep-alive, and the log says what happened
            c5:send(GET)
            assert.truthy(served(c5), "second request on the new connection")
            assert.truthy(srv:wait_log("idle keep%-alive connections closed to make room", 5),
                "no log line about closing idle keep-alive connections")
            for i = 1, 4 do conns[i]:close() end
            c5:close()
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("a connection still sending its request head is not closed for a waiting client", function()
        local srv = server.start { app = APP, tls = false, workers = 1,
            args = { "--limit", "connections=3" } }
        local ok, err = pcall(function()
            local conns = {}
            for i = 1, 3 do
                conns[i] = assert(srv:raw_conn())
                conns[i]:send("GET / HTTP/1.1\r\nHost: x\r\n") -- head not complete
            end
            local c4 = assert(srv:raw_conn())
            c4:send(GET)
            local r, why = c4:read_response { timeout = 1 }
            assert.is_nil(r, "a 4th connection was served while 3 requests were being sent")
            assert.are.equal("timeout", why)
            for i = 1, 3 do
                assert.truthy(conns[i]:is_open(0), "a connection mid-request was closed")
            end
            -- one finishes its request and is answered: it is now idle keep-alive, so it goes
            -- for the waiting client
            conns[2]:send("\r\n")
            assert.truthy(served(conns[2]), "the completed request was not answered")
            assert.truthy(served(c4, 10), "the waiting client was not served after a slot went idle")
            assert.truthy(conns[2]:wait_closed(5), "the idle connection was not the one closed")
            assert.truthy(conns[1]:is_open(0) and conns[3]:is_open(0),
                "a connection mid-request was closed")
            for i = 1, 3 do conns[i]:close() end
            c4:close()
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("idle h2 connections make room too, with GOAWAY", function()
        local srv = server.start { app = APP, tls = false, workers = 1,
            args = { "--limit", "connections=2" } }
        local ok, err = pcall(function()
            -- two h2c (prior knowledge) connections, one request each, then idle
            local conns = {}
            for i = 1, 2 do
                conns[i] = assert(srv:raw_conn())
                conns[i]:send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" .. "\0\0\0\4\0\0\0\0\0")
                local got = conns[i]:read_for(0.5)
                assert.truthy(#got >= 9, "no h2 SETTINGS from the server")
            end
            local c3 = assert(srv:raw_conn())
            c3:send(GET)
            assert.truthy(served(c3, 10), "a waiting client was not served while idle h2 "
                .. "connections held every slot")
            local closed, extra = conns[1]:wait_closed(5)
            assert.truthy(closed, "the oldest idle h2 connection is still open")
            -- a GOAWAY frame (type 7) came before the close
            local goaway = false
            local i = 1
            while i + 8 <= #extra do
                local len = extra:byte(i) * 65536 + extra:byte(i + 1) * 256 + extra:byte(i + 2)
                if extra:byte(i + 3) == 7 then goaway = true end
                i = i + 9 + len
            end
            assert.truthy(goaway, "no GOAWAY before the idle h2 connection was closed")
            for j = 1, 2 do conns[j]:close() end
            c3:close()
        end)
        srv:stop()
        assert(ok, err)
    end)
end)

describe("graceful stop (SIGTERM)", function()
    local STOP_APP = [=[
local k = require "khamsin"
local big = string.rep("x", 4 * 1048576)
k.get("/big", function() return big end)
]=]
    for _, proto in ipairs { "h1", "h2" } do
        it("delivers a whole " .. proto .. " answer still being written to a slow reader", function()
            local srv = server.start { app = STOP_APP, tls = false, workers = 1, args = { "--grace", "30" } }
            local ok, err = pcall(function()
                -- 4 MiB at ~1 MB/s: the answer is queued whole long before the reader has it; the
                -- stop comes once the reader has the response's head (its "head" line), so the
                -- answer is being written however long the reader took to start
                local cmd = string.format("SLOW_READER_SAY_HEAD=1 timeout 60 %s %s %s %d /big 1000000 2>&1",
                    PY, READER, proto, srv.port)
                local p = assert(io.popen(cmd, "r"))
                local first = p:read("*l")
                assert.are.equal("head", first, "slow_reader.py did not get the response's head")
                server.sleep(0.2)
                local t_term = server.now()
                srv:signal("TERM")
                local out = p:read("*a")
                p:close()
                local line = out:match("(%b{})%s*$")
                assert(line, "slow_reader.py printed no JSON:\n" .. out)
                local r = cjson.decode(line)
                assert.are.equal(200, r.status)
                assert.are.equal(4 * 1048576, r.bytes, "the answer was cut by the graceful stop: " .. line)
                -- and the stop ends once the answer is out, well within the grace period
                local code = srv:wait_exit(20)
                assert.are.equal(0, code, "exit code after SIGTERM")
                assert.truthy(server.now() - t_term < 25, "the stop waited for the whole grace period")
            end)
            srv:stop()
            assert(ok, err)
        end)
    end
end)
