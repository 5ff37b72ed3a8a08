-- spec/h3_load_spec.lua: HTTP/3 under load and in bulk. kh-h3load (core/tools/kh_h3load.c, our
-- load generator) completes many requests over connections x streams without a failure, and
-- counts a non-200 answer and a reset stream as failures; a 2 MiB answer arrives intact whether
-- the server sends runs of packets with GSO (UDP_SEGMENT, limit h3_gso = 1, the default) or one
-- sendmsg per packet (h3_gso = 0), with recvmmsg batches of 10 or single reads (h3_recv_batch).
local server = require "helpers.server"
local h3 = require "helpers.h3"

local sh_quote = server.sh_quote

local APP = [[
local k = require "khamsin"
k.get("/", function(req) return "Hello, World!" end)
local big, pad = {}, string.rep("y", 1015) .. "\n"
for i = 1, 2048 do big[i] = string.format("%08x", i) .. pad end
big = table.concat(big) -- 2 MiB, every KiB numbered: a lost or reordered packet shows
k.get("/big", function(req) return big end)
k.get("/reset", function(req, res)
    res:write("partial")
    k.sleep(0.01)
    error("reset on purpose")
end)
]]

local tool = h3.tool
local run = h3.run
local quic_port = h3.quic_port

local function start(args)
    local a = { "--http3" }
    for _, x in ipairs(args or {}) do a[#a + 1] = x end
    return server.start { app = APP, tls = true, args = a, start_timeout = 20,
        expect_errors = { "reset on purpose" } }
end

local function with(srv, fn)
    local ok, err = pcall(fn)
    srv:stop()
    assert(ok, err)
end

-- kh-h3load with args against path; returns its output, exit code and parsed counts
local function load(srv, path, args)
    local parts = { sh_quote(tool("kh-h3load")) }
    for _, a in ipairs(args) do parts[#parts + 1] = sh_quote(a) end
    parts[#parts + 1] = sh_quote(string.format("https://127.0.0.1:%d%s", quic_port(srv), path))
    local out, rc = run(table.concat(parts, " "))
    local issued, done, ok, failed, non200, reset, lost = out:match(
        "requests: (%d+) issued, (%d+) done, (%d+) ok, (%d+) failed %((%d+) not 200, (%d+) reset, (%d+) lost")
    assert(issued, out)
    return out, rc, { issued = tonumber(issued), done = tonumber(done), ok = tonumber(ok),
        failed = tonumber(failed), non200 = tonumber(non200), reset = tonumber(reset),
        lost = tonumber(lost) }
end

local function expected_big()
    local t, pad = {}, string.rep("y", 1015) .. "\n"
    for i = 1, 2048 do t[i] = string.format("%08x", i) .. pad end
    return table.concat(t)
end

describe("HTTP/3 load and bulk", function()
    it("kh-h3load: 2000 requests over 10 connections x 10 streams, none failed", function()
        local srv = start()
        with(srv, function()
            local out, rc, n = load(srv, "/", { "-c", "10", "-m", "10", "-n", "2000" })
            assert.are.equal(0, rc, out)
            assert.are.same({ issued = 2000, done = 2000, ok = 2000, failed = 0, non200 = 0,
                reset = 0, lost = 0 }, n)
            local p50, p99 = out:match("latency ms: min [%d.]+ p50 ([%d.]+) p90 [%d.]+ p99 ([%d.]+)")
            assert.truthy(p50 and tonumber(p50) > 0 and tonumber(p99) >= tonumber(p50), out)
            assert.truthy(out:match("time: [%d.]+ s, %d+ req/s"), out)
        end)
    end)

    it("kh-h3load counts a non-200 answer and a reset stream as failures (exit 1)", function()
        local srv = start()
        with(srv, function()
            local out, rc, n = load(srv, "/missing", { "-c", "2", "-m", "5", "-n", "40" })
            assert.are.equal(1, rc, out)
            assert.are.same({ issued = 40, done = 40, ok = 0, failed = 40, non200 = 40, reset = 0,
                lost = 0 }, n)
            out, rc, n = load(srv, "/reset", { "-c", "2", "-m", "5", "-n", "20" })
            assert.are.equal(1, rc, out)
            assert.are.same({ issued = 20, done = 20, ok = 0, failed = 20, non200 = 0, reset = 20,
                lost = 0 }, n)
            -- and the server still serves on
            out, rc, n = load(srv, "/", { "-c", "2", "-m", "5", "-n", "50" })
            assert.are.equal(0, rc, out)
            assert.are.equal(50, n.ok)
        end)
    end)

    for _, v in ipairs { { gso = "1", batch = "10" }, { gso = "0", batch = "1" } } do
        it(string.format("a 2 MiB answer arrives intact (h3_gso=%s, h3_recv_batch=%s)", v.gso,
            v.batch), function()
            local srv = start { "--limit", "h3_gso=" .. v.gso, "--limit", "h3_recv_batch=" .. v.batch }
            with(srv, function()
                local want = expected_big()
                local file = srv.dir .. "/big.out"
                for _ = 1, 2 do
                    os.remove(file)
                    local out, rc = run(string.format("%s -o %s %s", sh_quote(tool("kh-h3get")),
                        sh_quote(file), sh_quote(string.format("https://127.0.0.1:%d/big", quic_port(srv)))))
                    assert.are.equal(0, rc, out)
                    local got = server.read_file(file) or ""
                    assert.are.equal(#want, #got)
                    assert.truthy(got == want, "the body differs from what the server sent")
                end
                -- two at once on each of two connections, too
                local out, rc, n = load(srv, "/big", { "-c", "2", "-m", "2", "-n", "4" })
                assert.are.equal(0, rc, out)
                assert.are.equal(4, n.ok)
                -- the kernel took every UDP_SEGMENT send (no fallback to one packet per call)
                assert.falsy(srv:log():find("GSO off", 1, true), srv:log())
                assert.falsy(srv:log():find("no UDP_SEGMENT", 1, true), srv:log())
            end)
        end)
    end
end)
