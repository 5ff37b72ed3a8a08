-- spec/write_timeout_spec.lua: write_timeout_ms is the longest a response write may stall, i.e.
-- go without progress (issue 9, item 3). A reader that is slow but steady gets the whole body
-- however long that takes; a reader that stops is closed about write_timeout_ms later. Over
-- HTTP/1.1 and HTTP/2 (prior knowledge), with spec/helpers/slow_reader.py as the client (a
-- read every 20 ms from a 64 KiB receive buffer: slow, never pausing).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local READER = server.root .. "/spec/helpers/slow_reader.py"
local MIB = 1024 * 1024

local APP = [[
local k = require "khamsin"
local mb = ("x"):rep(1024 * 1024)
-- made once: building 16 MiB in a handler holds an ASan build's loop for a second
local made = { [6] = mb:rep(6), [16] = mb:rep(16) }
k.get("/", function() return "ok" end)
k.get("/big/:n", function(req) local n = tonumber(req.params.n) return made[n] or mb:rep(n) end)
]]

-- Runs the reader; while it runs, watch the log for the close (see_close) and note when it
-- appears. Returns the reader's JSON, the time (server.now()) the close was logged (or nil), and
-- the log lines written meanwhile.
local function read_slowly(srv, proto, path, rate, stop_after, wait)
    local extra = stop_after and string.format(" %d %s", stop_after, wait) or ""
    local cmd = string.format("timeout 90 %s %s %s %d %s %d%s 2>&1", PY, READER, proto, srv.port,
        path, rate, extra)
    local from = srv:log_size()
    local p = assert(io.popen(cmd, "r"))
    local closed_at
    if stop_after then
        -- the reader sleeps `wait` s after it stops; the close must be logged meanwhile
        server.wait_until(wait + 10, function()
            if srv:log():sub(from + 1):match("write stalled") then
                closed_at = server.now()
                return true
            end
        end, 0.01)
    end
    local out = p:read("*a")
    p:close()
    local line = out:match("(%b{})%s*$")
    assert(line, "slow_reader.py printed no JSON:\n" .. out)
    local r = cjson.decode(line)
    return r, closed_at, srv:log():sub(from + 1)
end

describe("write_timeout_ms", function()
    local srv
    setup(function()
        srv = server.start { app = APP, tls = false,
            args = { "--limit", "write_timeout_ms=1000", "--log-level", "debug" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    for _, proto in ipairs { "h1", "h2" } do
        it("lets a slow but steady " .. proto .. " reader take the whole body, however long", function()
            -- 6 MiB at about 1 MB/s: ~6 s, six times the timeout; before, the write of the body
            -- was timed as a whole and cut after 1 s plus what the kernel buffers held
            local r, _, log = read_slowly(srv, proto, "/big/6", 1000000)
            local why = cjson.encode(r)
            assert.are.equal(200, r.status, why)
            assert.are.equal(6 * MIB, r.expected, why)
            assert.are.equal(6 * MIB, r.bytes, "body cut short: " .. why)
            assert.is_false(r.closed, why)
            assert.truthy(r.elapsed > 3, "the reader was not slow: " .. why)
            -- the reader itself must not have paused near the timeout, or the spec proves nothing
            assert.truthy(r.max_gap < 0.7, "the reader paused: " .. why)
            assert.is_nil(log:match("write stalled"), "a write stalled")
        end)

        it("closes an " .. proto .. " connection whose reader stops, write_timeout_ms later", function()
            -- 16 MiB: more than the kernel's buffers hold, so a close shows as a short body
            local r, closed_at, log = read_slowly(srv, proto, "/big/16", 1000000, 256 * 1024, 4)
            local why = cjson.encode(r)
            assert.are.equal(200, r.status, why)
            assert.truthy(closed_at, "no 'write stalled' close logged within 4 s: " .. why)
            assert.truthy(r.closed, "the connection was not closed: " .. why)
            assert.truthy(r.bytes < 16 * MIB, "the whole body arrived: " .. why)
            -- stalled from about the moment the reader stopped (its receive buffer fills at
            -- once); closed after 1 s without progress, checked every 250 ms
            local stall = closed_at - r.stopped_epoch
            print(string.format("\n  %s: reader stopped, closed %.2f s later", proto, stall))
            assert.truthy(stall > 0.8 and stall < 3, "closed " .. stall .. " s after the stop")
            local ms = tonumber(log:match("write stalled %(%d+ bytes unacknowledged for (%d+) ms%)"))
            assert.truthy(ms and ms >= 1000, "logged stall: " .. tostring(ms))
        end)
    end

    it("answers other clients meanwhile and logs no error", function()
        assert.are.equal("ok", srv:request { path = "/" }.body)
        assert.are.same({}, srv:unexpected_errors())
    end)
end)
