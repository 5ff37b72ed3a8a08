-- spec/h3_close_spec.lua: how QUIC connections end (RFC 9000 §10.2) and how the workers'
-- UDP sockets stop. A connection the server closed keeps its CIDs for three PTOs and answers
-- the packets that still come with its CONNECTION_CLOSE again (the 1st, 2nd, 4th, 8th...), one
-- the client closed is drained (silence), and once the period is over a packet for it gets a
-- stateless reset. At a graceful stop each worker's UDP socket stays in the reuseport group
-- until every worker has stopped, so the CID router keeps steering packets to the worker that
-- still drains its connections.
local server = require "helpers.server"
local h3 = require "helpers.h3"

local sh_quote = server.sh_quote

local APP = [[
local k = require "khamsin"
k.get("/", function(req) return "Hello, World!" end)
k.get("/big", function(req)
    k.log.info("big started")
    k.sleep(tonumber(req.args.s or "1"))
    return string.rep("0123456789abcdef", 200000) -- 3.2 MB: the client's windows must move
end)
]]

local h3get_bin = h3.h3get_bin
local run = h3.run
local function quic_port(srv) return h3.quic_port(srv, 15) end

local function h3get(port, path, args)
    local parts = { "timeout 60", sh_quote(h3get_bin()), "-o", "/dev/null" }
    for _, a in ipairs(args or {}) do parts[#parts + 1] = sh_quote(a) end
    parts[#parts + 1] = sh_quote(string.format("https://127.0.0.1:%d%s", port, path))
    return run(table.concat(parts, " "))
end

local function with(srv, fn)
    local ok, err = pcall(fn)
    srv:stop()
    assert(ok, err)
end

describe("HTTP/3 connection close", function()
    it("keeps a connection it closed in its closing period, answering with CONNECTION_CLOSE", function()
        local srv = server.start { app = APP, tls = true, start_timeout = 20,
            args = { "--http3", "--log-level", "debug" } }
        with(srv, function()
            -- the server closes the connection (DATA before HEADERS: H3_FRAME_UNEXPECTED); the
            -- client then sends 8 more packets at once, and one 4 s later (past three PTOs, even
            -- on a loaded box)
            local out, rc = h3get(quic_port(srv), "/", { "--raw-bidi", "00 01 61", "--replay", "8",
                "--replay-late", "4000" })
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("server closed the connection (application 0x105)", 1, true), out)
            assert.truthy(out:find("replay: sent 8, close 4, reset 0", 1, true), out)
            assert.truthy(out:find("late: reset", 1, true), out)
            local ms = tonumber(srv:wait_log("quic: closing period: (%d+) ms", 5))
            assert.truthy(ms and ms < 3500, "three PTOs, shorter than the late replay's wait: " .. tostring(ms))
            -- the 8 replays (and whatever the client had sent before it saw the close)
            local came = tonumber(srv:wait_log("quic: closing period over: (%d+) packets came", 5))
            assert.truthy(came and came >= 8, srv:log())
        end)
    end)

    it("drains a connection the client closed: silence, then a stateless reset", function()
        local srv = server.start { app = APP, tls = true, start_timeout = 20,
            args = { "--http3", "--log-level", "debug" } }
        with(srv, function()
            local out, rc = h3get(quic_port(srv), "/", { "-w", "--replay", "8", "--replay-late", "4000" })
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("status=200", 1, true), out)
            assert.truthy(out:find("replay: sent 8, close 0, reset 0", 1, true), out)
            assert.truthy(out:find("late: reset", 1, true), out)
            local ms = tonumber(srv:wait_log("quic: draining period: (%d+) ms", 5))
            assert.truthy(ms and ms < 3500, "three PTOs, shorter than the late replay's wait: " .. tostring(ms))
            -- the 8 replays (and whatever the client had sent before it saw the close)
            local came = tonumber(srv:wait_log("quic: closing period over: (%d+) packets came", 5))
            assert.truthy(came and came >= 8, srv:log())
        end)
    end)

    it("stops gracefully across workers: one done, the others' responses still flow", function()
        -- 3 workers: worker 0 has nothing to finish and stops at once; workers 1 and 2 each
        -- send a 3.2 MB response that needs the client's window updates, which the CID router
        -- must still steer to them (were worker 0's socket to leave the reuseport group, the
        -- group's order would change under the router's feet)
        local srv = server.start { app = APP, tls = true, start_timeout = 20, workers = 3,
            args = { "--http3", "--grace", "30", "--log-level", "debug" } }
        local port = quic_port(srv)
        local outs = {}
        for i, b in ipairs({ 1, 2, 2 }) do
            outs[i] = srv.dir .. "/c" .. i .. ".out"
            os.execute(string.format("(%s -w -o %s --first-dcid-byte %d --timeout 20 %s >%s 2>&1; echo rc=$? >>%s) &",
                sh_quote(h3get_bin()), sh_quote(srv.dir .. "/c" .. i .. ".body"), b,
                sh_quote(string.format("https://127.0.0.1:%d/big?s=2", port)), sh_quote(outs[i]),
                sh_quote(outs[i])))
        end
        assert.truthy(server.wait_until(15, function()
            local _, n = srv:log():gsub("big started", "")
            return n == 3
        end), srv:log())
        local log = srv:log()
        assert.truthy(log:find("w1: request [^\n]*big started") and log:find("w2: request [^\n]*big started"), log)
        assert.falsy(log:find("w0: request [^\n]*big started"), log)
        srv:signal("TERM")
        assert.truthy(srv:wait_log("w0: quic: the worker's sockets close", 10), srv:log())
        -- while workers 1 and 2 drain, the router still finds them: a short-header packet for
        -- an unknown CID of worker 1 or 2, from 12 source addresses (the kernel's fallback
        -- hash would vary with them), gets each time the stateless reset only its owner sends
        local probe = string.format([=[
import socket, time
socks = []
for i in range(12):
    for w in (1, 2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(bytes([0x40, w]) + bytes(range(1, 18)) + bytes(40), ("127.0.0.1", %d))
        socks.append((w, s))
got = {1: 0, 2: 0}
end = time.time() + 3
for w, s in socks:
    s.settimeout(max(0.01, end - time.time()))
    try:
        s.recvfrom(2048)
        got[w] += 1
    except socket.timeout:
        pass
print("resets", got[1], got[2])
]=], port)
        local pout = run("/usr/bin/python3 -c " .. sh_quote(probe))
        assert.truthy(pout:find("resets 12 12", 1, true), pout)
        local code = srv:wait_exit(30)
        assert.are.equal(0, code, srv:log())
        for i = 1, 3 do
            local out = server.wait_until(20, function()
                local s = server.read_file(outs[i])
                return s and s:find("rc=") and s
            end)
            assert.truthy(out, "client " .. i .. " finished")
            assert.truthy(out:find("status=200", 1, true), out)
            assert.truthy(out:find("rc=0", 1, true), out)
            local body = server.read_file(srv.dir .. "/c" .. i .. ".body")
            assert.are.equal(3200000, #body)
        end
        -- worker 0 was done before the responses were
        log = srv:log()
        local w0 = log:find("w0: quic: the worker's sockets close", 1, true)
        local w1 = log:find("w1: quic: the worker's sockets close", 1, true)
        local w2 = log:find("w2: quic: the worker's sockets close", 1, true)
        assert.truthy(w0 and w1 and w2, log)
        assert.truthy(w0 < w1 and w0 < w2, log)
        srv:stop()
    end)
end)
