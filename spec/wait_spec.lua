-- Waits that do not block the loop: k.sleep, k.timer, k.every, k.now; waits inside pcall and
-- inside the app's own coroutines; timer callbacks in coroutines of their own; slow-slice and
-- stalled-loop reports.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local state = {}
k.get("/sleep", function(req)
    local t0 = k.now()
    k.sleep(tonumber(req.args.s))
    return string.format("%.3f", k.now() - t0)
end)
k.get("/sleep0", function() k.sleep(0); k.sleep(0); return "z" end)
k.get("/pcall", function()
    local ok, e = pcall(function() k.sleep(0.01); error("inner") end)
    local ok2, v = pcall(k.sleep, 0.01)
    return tostring(ok) .. " " .. tostring(e):match("inner") .. " " .. tostring(ok2)
end)
k.get("/co", function()
    local gen = coroutine.wrap(function(a)
        k.sleep(0.01)
        local b = coroutine.yield(a + 1)
        k.sleep(0.01)
        return b * 2
    end)
    local x = gen(1)
    local y = gen(10)
    local co = coroutine.create(function() k.sleep(0.01); return "res" end)
    local ok, r = coroutine.resume(co)
    return x .. " " .. y .. " " .. tostring(ok) .. " " .. r .. " " .. coroutine.status(co)
end)
k.get("/timer", function()
    local fired = false
    k.timer(0.02, function() k.sleep(0.01); state.timer = "fired after a sleep in the callback" end)
    local t = k.timer(0.02, function() state.cancelled = "ran" end)
    local was = t:cancel()
    -- until the first callback is done (polled, at most 2 s: on a loaded box its 0.01 s sleep
    -- can end after a fixed wait would), and at least past the cancelled one's time
    k.sleep(0.08)
    for _ = 1, 200 do
        if state.timer then break end
        k.sleep(0.01)
    end
    return tostring(state.timer) .. " / cancelled " .. tostring(was) .. " " .. tostring(state.cancelled)
end)
local ticks = 0
local ev
k.get("/every", function()
    ticks = 0
    ev = k.every(0.02, function() ticks = ticks + 1 end)
    k.sleep(0.15)
    ev:cancel()
    local n = ticks
    k.sleep(0.06)
    return n .. " " .. ticks
end)
k.get("/timer_error", function()
    k.timer(0, function() error("boom in a timer") end)
    k.sleep(0.05)
    return "still here"
end)
k.get("/now", function() return tostring(k.now()) end)
k.get("/busy", function() local t = os.clock() while os.clock() - t < 0.06 do end return "spun" end)
-- spins 1.4 s of wall time (CLOCK_MONOTONIC) however little CPU a loaded box gives it (an
-- os.clock() bound, CPU time, took 10 s of wall time at load 19)
local ffi = require "ffi"
ffi.cdef "typedef struct { long sec; long nsec; } wait_spec_ts; int clock_gettime(int, wait_spec_ts *);"
local function mono()
    local ts = ffi.new("wait_spec_ts")
    ffi.C.clock_gettime(1, ts)
    return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end
k.get("/stall", function() local t = mono() while mono() - t < 1.4 do end return "stalled" end)
k.get("/load_wait", function() return tostring(state.load_error) end)
state.load_error = select(2, pcall(k.sleep, 0))
]]

describe("waits", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    it("k.sleep(s) waits about s seconds without blocking other requests", function()
        local c = assert(srv:raw_conn())
        c:send("GET /sleep?s=0.5 HTTP/1.1\r\nHost: x\r\n\r\n")
        local t0 = server.now()
        -- answered while the other one sleeps (a raw request: no client process to start, whose
        -- start-up on a loaded box is what made a curl here miss the bound)
        local r = assert(srv:raw_request { path = "/sleep0" })
        assert.are.equal(200, r.status)
        assert.is_true(server.now() - t0 < 0.45, "a sleeping request blocked another one")
        local resp = assert(c:read_response { timeout = 3 })
        c:close()
        local slept = tonumber(resp.body)
        assert.is_true(slept >= 0.49 and slept < 1.0, "slept " .. resp.body)
    end)

    server.each_protocol(function(proto)
        it("sleeps, in pcall and in user coroutines, over " .. proto, function()
            assert.are.equal("z", srv:request { proto = proto, path = "/sleep0" }.body)
            assert.are.equal("false inner true", srv:request { proto = proto, path = "/pcall" }.body)
            assert.are.equal("2 20 true res dead", srv:request { proto = proto, path = "/co" }.body)
        end)
    end)

    it("k.sleep(0) yields and comes back", function()
        assert.are.equal("z", srv:request { path = "/sleep0" }.body)
    end)

    it("works inside pcall", function()
        assert.are.equal("false inner true", srv:request { path = "/pcall" }.body)
    end)

    it("works inside the app's own coroutines (wrap and resume)", function()
        assert.are.equal("2 20 true res dead", srv:request { path = "/co" }.body)
    end)

    it("k.timer runs a callback that may sleep; :cancel() stops one", function()
        local r = srv:request { path = "/timer" }
        assert.are.equal("fired after a sleep in the callback / cancelled true nil", r.body)
    end)

    it("k.every repeats until cancelled", function()
        local r = srv:request { path = "/every" }
        local n, after = r.body:match("^(%d+) (%d+)$")
        n, after = tonumber(n), tonumber(after)
        assert.is_true(n >= 4 and n <= 9, r.body)
        assert.are.equal(n, after, "ticked after :cancel()")
    end)

    it("logs a Lua error in a timer callback and goes on", function()
        local log = srv:capture_errors(function()
            assert.are.equal("still here", srv:request { path = "/timer_error" }.body)
        end)
        assert.truthy(log:find("timer callback failed: .*boom in a timer"), log)
        assert.are.equal(200, srv:request { path = "/now" }.status)
    end)

    it("refuses a wait while the script loads, with a clear message", function()
        local r = srv:request { path = "/load_wait" }
        assert.truthy(r.body:find("can only be called from a handler"), r.body)
    end)

    it("k.now() is the loop clock in seconds", function()
        local a = tonumber(srv:request { path = "/now" }.body)
        local b = tonumber(srv:request { path = "/now" }.body)
        assert.is_true(b >= a)
    end)
end)

describe("watchdog", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    it("logs a Lua slice over slice_warn_ms with the route and its duration", function()
        local mark = srv:log_size()
        srv:request { path = "/busy" }
        local line = srv:wait_log("slow Lua slice: ([%d.]+ ms in GET /busy %(route GET /busy;)", 2, mark)
        assert.truthy(line, srv:log())
    end)

    it("reports a worker loop stalled for more than 1 s from the main thread", function()
        local mark = srv:log_size()
        local r = srv:request { path = "/stall", timeout = 10 }
        assert.are.equal("stalled", r.body)
        assert.truthy(srv:wait_log("w0: event loop stalled for %d+ ms", 2, mark), srv:log())
        assert.truthy(srv:wait_log("w0: event loop running again", 2, mark), srv:log())
    end)
end)
