-- A worker stuck in Lua (issue 9, item 4): new connections go to the other workers while it is
-- stalled (stall_shed_ms), a second SIGTERM/SIGINT exits at once naming the stalled worker and
-- its route, stall_exit_ms ends the process, handler_interrupt_ms turns an interpretable loop
-- into a 500. README "Watchdog" and "Command line" describe what these specs check.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "ok" end)
k.get("/who", function() return tostring(k.worker_id()) end)
k.get("/timer-spin", function() k.timer(0, function() while true do end end) return "armed" end)
-- compiled by the JIT into a trace that loops in machine code: nothing can interrupt it
k.get("/spin", function() while true do end end)
-- stalls about `s` seconds; os.time is a C function, so the loop is not one compiled trace
k.get("/stall/:s", function(req)
    local t = os.time() + tonumber(req.params.s)
    while os.time() < t do end
    return "back"
end)
-- loops forever in the interpreter: LuaJIT runs hooks only there (jit.off: never compiled)
local function busy()
    local n = 0
    while true do n = n + #tostring(os.time()) end
end
jit.off(busy)
k.get("/busy", busy)
-- catches the interrupt and goes on looping: the second interrupt does not let it go
local function stubborn()
    while true do
        pcall(function() while true do local _ = os.time() end end)
    end
end
jit.off(stubborn, true)
k.get("/stubborn", stubborn)
]]

-- Sends a request on a new connection and returns the raw socket (the reply is not read).
local function fire(srv, path)
    local c = assert(server.connect(srv.host, srv.port))
    assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    return c
end

-- One GET on a new connection; returns status, body (or nil, why) within `timeout` s.
local function get(srv, path, timeout)
    local c, err = server.connect(srv.host, srv.port, { connect_timeout = timeout })
    if not c then return nil, err end
    c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    local r, why = c:read_response { timeout = timeout }
    c:close()
    if not r then return nil, why end
    return r.status, r.body
end

-- Starts /spin (or `path`) on some worker and waits until the supervisor took that worker out
-- of the reuseport group. Returns the stalled worker's number and the client socket.
local function stall_one(srv, path)
    local mark = srv:log_size()
    local c = fire(srv, path or "/spin")
    local w = srv:wait_log("w(%d+): no new connections while stalled", 10, mark)
    assert(w, "no shed line in the log:\n" .. srv:log())
    return tonumber(w), c
end

describe("a worker stalled in Lua", function()
    it("gets no new connections once stalled past stall_shed_ms: 40 new requests all succeed", function()
        local srv = server.start { app = APP, workers = 2, tls = false }
        local ok, err = pcall(function()
            local w, c = stall_one(srv)
            local failed, t0 = {}, server.now()
            for i = 1, 40 do
                local status, body = get(srv, "/", 5)
                if status ~= 200 or body ~= "ok" then
                    failed[#failed + 1] = i .. ": " .. tostring(status) .. " " .. tostring(body)
                end
            end
            local took = server.now() - t0
            assert.are.same({}, failed, "requests that failed while w" .. w .. " was stalled")
            assert.is_true(took < 30, string.format("40 requests took %.1f s", took))
            c:close()
        end)
        -- it never returns: the second SIGTERM ends it (exit code 3, tested below)
        srv:signal("TERM")
        srv:signal("TERM")
        srv:wait_exit(10)
        srv:kill()
        assert(ok, err)
    end)

    it("names a timer callback that stalls it", function()
        local srv = server.start { app = APP, workers = 2, tls = false }
        local ok, err = pcall(function()
            local mark = srv:log_size()
            assert.are.equal("armed", select(2, get(srv, "/timer-spin", 5)))
            assert.truthy(srv:wait_log("w%d: no new connections while stalled %(%d+ ms in timer callback;", 10, mark),
                srv:log())
            assert.are.equal(200, (get(srv, "/", 5)))
        end)
        srv:signal("TERM")
        srv:signal("TERM")
        srv:wait_exit(10)
        srv:kill()
        assert(ok, err)
    end)

    it("takes connections again once it runs again", function()
        local srv = server.start { app = APP, workers = 2, tls = false }
        local ok, err = pcall(function()
            local mark = srv:log_size()
            local w, c = stall_one(srv, "/stall/3")
            -- while it is stalled, every new connection lands on the other worker
            for _ = 1, 10 do
                local status, body = get(srv, "/who", 5)
                assert.are.equal(200, status)
                assert.are_not.equal(tostring(w), body)
            end
            local r = c:read_response { timeout = 10 }
            assert.truthy(r, "the stalled request never finished")
            assert.are.equal("back", r.body)
            assert.truthy(srv:wait_log("w" .. w .. ": takes new connections again", 5, mark), srv:log())
            local seen = {}
            for _ = 1, 40 do
                local status, body = get(srv, "/who", 5)
                assert.are.equal(200, status)
                seen[body] = true
            end
            assert.truthy(seen[tostring(w)], "w" .. w .. " took none of 40 new connections")
        end)
        srv:stop()
        assert(ok, err)
    end)
end)

describe("stopping with a stalled worker", function()
    for _, second in ipairs { "TERM", "INT" } do
        it("SIGTERM then SIG" .. second .. ": exits at once, code 3, naming the worker and route", function()
            local srv = server.start { app = APP, workers = 2, tls = false, args = { "--grace", "30" } }
            local ok, err = pcall(function()
                local w = stall_one(srv)
                local mark = srv:log_size()
                srv:signal("TERM")
                assert.truthy(srv:wait_log("w" .. w .. " is stalled [^\n]* in GET /spin", 5, mark), srv:log())
                -- the healthy worker has stopped; the process waits for the stalled one
                assert.is_nil(srv:wait_exit(0.5))
                local t0 = server.now()
                srv:signal(second)
                local code = srv:wait_exit(5)
                assert.are.equal(3, code, srv:log())
                assert.is_true(server.now() - t0 < 3)
                local line = srv:log():sub(mark + 1):match("worker " .. w .. " stalled %d+ ms in GET /spin: exiting now[^\n]*")
                assert.truthy(line, srv:log())
            end)
            srv:kill()
            assert(ok, err)
        end)
    end

    it("one SIGTERM: exits with code 3 once the grace period is over", function()
        local srv = server.start { app = APP, workers = 2, tls = false, args = { "--grace", "1" } }
        local ok, err = pcall(function()
            local w = stall_one(srv)
            local mark = srv:log_size()
            srv:signal("TERM")
            local code = srv:wait_exit(10)
            assert.are.equal(3, code, srv:log())
            assert.truthy(srv:log():sub(mark + 1):match("worker " .. w .. " stalled %d+ ms in GET /spin: exiting now"),
                srv:log())
        end)
        srv:kill()
        assert(ok, err)
    end)
end)

describe("stall_exit_ms", function()
    it("ends the process with code 4 and a message naming the worker and route", function()
        local srv = server.start { app = APP, workers = 2, tls = false, args = { "--stall-exit-ms", "1500" } }
        local ok, err = pcall(function()
            local t0 = server.now()
            fire(srv, "/spin")
            local code = srv:wait_exit(15)
            assert.are.equal(4, code, srv:log())
            assert.is_true(server.now() - t0 >= 1.4)
            assert.truthy(srv:log():match("worker %d stalled %d+ ms in GET /spin: over stall_exit_ms=1500, exiting"),
                srv:log())
        end)
        srv:kill()
        assert(ok, err)
    end)

    it("is off by default: a stalled worker does not end the process", function()
        local srv = server.start { app = APP, workers = 2, tls = false }
        local ok, err = pcall(function()
            local mark = srv:log_size()
            fire(srv, "/stall/3")
            assert.truthy(srv:wait_log("event loop stalled for %d+ ms", 10, mark), srv:log())
            assert.truthy(srv:wait_log("running again", 10, mark), srv:log())
            assert.is_nil(srv:exit_code())
        end)
        srv:stop()
        assert(ok, err)
    end)
end)

describe("handler_interrupt_ms", function()
    it("turns an interpretable endless loop into a 500, logged with its traceback; the worker serves again", function()
        local srv = server.start { app = APP, workers = 1, tls = false,
            args = { "--handler-interrupt-ms", "300" } }
        local ok, err = pcall(function()
            local status, body
            local log = srv:capture_errors(function()
                local t0 = server.now()
                status, body = get(srv, "/busy", 10)
                assert.is_true(server.now() - t0 < 5)
            end)
            assert.are.equal(500, status, tostring(body))
            assert.truthy(log:match("handler interrupted after %d+ ms %(handler_interrupt_ms=300%)"), log)
            assert.truthy(log:find("app.lua:16", 1, true), "no traceback naming the loop's line:\n" .. log)
            assert.are.equal(200, (get(srv, "/", 5)))
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("does not let a handler that catches the interrupt loop on", function()
        local srv = server.start { app = APP, workers = 1, tls = false,
            args = { "--handler-interrupt-ms", "300" } }
        local ok, err = pcall(function()
            local status
            srv:capture_errors(function() status = get(srv, "/stubborn", 10) end)
            assert.are.equal(500, status)
            assert.are.equal(200, (get(srv, "/", 5)))
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("cannot interrupt a loop the JIT compiled: says so; the worker is still shed", function()
        local srv = server.start { app = APP, workers = 2, tls = false,
            args = { "--handler-interrupt-ms", "200" } }
        local ok, err = pcall(function()
            local mark = srv:log_size()
            local w = stall_one(srv)
            assert.truthy(srv:wait_log("w" .. w .. ": GET /spin still runs %d+ ms after it was interrupted: a loop the JIT compiled",
                5, mark), srv:log())
            assert.are.equal(200, (get(srv, "/", 5)))
        end)
        srv:signal("TERM")
        srv:signal("TERM")
        srv:wait_exit(10)
        srv:kill()
        assert(ok, err)
    end)

    it("leaves a handler alone that runs shorter than the limit", function()
        local srv = server.start { app = APP, workers = 1, tls = false,
            args = { "--handler-interrupt-ms", "5000" } }
        local ok, err = pcall(function()
            local status, body = get(srv, "/stall/1", 10)
            assert.are.equal(200, status)
            assert.are.equal("back", body)
        end)
        srv:stop()
        assert(ok, err)
    end)
end)
