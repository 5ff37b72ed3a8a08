-- spec/h3_idle_mem_spec.lua: what an idle HTTP/3 connection costs (issue 12). N connections
-- from a kh-h3load (--hold: one GET each, answered 200, then held open and idle until it gets
-- SIGUSR1, then closed; --ramp: 20 handshakes at a time) to a server of its own with one
-- worker, after WARM others held the same way: its RssAnon (private anonymous resident memory, /proc/<pid>/status; PSS would also
-- drop when kh-h3load maps the same ngtcp2, nghttp3 and GnuTLS pages) grows by less than BOUND
-- per connection, and by more than FLOOR, so that a reading of the wrong process, or of
-- connections already gone, cannot pass.
-- Where the bytes go (bench/results/h3mem-trace-20261202.txt): ngtcp2 0.12's and nghttp3 0.8's
-- per-connection pools, of which an idle connection uses the front; kh_quic.c mmaps them, so
-- only their used pages count, and keeps ngtcp2_conn (8.2 KiB) in the heap.
local server = require "helpers.server"
local h3 = require "helpers.h3"

local N, WARM = 100, 30
-- Bytes per idle connection (the slope: N more after WARM), measured on the 2-core VM: release
-- build ~85-87 KB (bench/h3mem.sh with 1,000-5,000 held: 83-86 KB; before: 113-118 KB with every
-- pool in the heap and the GnuTLS session kept), ASan build (redzones, quarantine and stack
-- traces off) ~116 KB. h2 over TLS: ~9.6-10 KB (h2_idle_mem_spec.lua, bench/h3mem.sh). The
-- bound has room for the run-to-run spread (~3 KB), not for a pool back in the heap.
local ldd = io.popen("ldd " .. server.sh_quote(server.bin()) .. " 2>/dev/null")
local ASAN = ldd:read("*a"):find("libasan") ~= nil
ldd:close()
local BOUND = (ASAN and 128 or 96) * 1024
local FLOOR = 40 * 1024 -- ngtcp2_conn, nghttp3_conn and a page of each pool at the least

local APP = [[
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
]]

local function anon_kib(pid)
    local f = io.open("/proc/" .. pid .. "/status")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return tonumber(s:match("RssAnon:%s*(%d+)"))
end

describe("idle h3 connections", function()
    it("cost less than " .. BOUND .. " bytes each (" .. N .. " held after " .. WARM .. ")", function()
        local asan = (os.getenv("ASAN_OPTIONS") or "")
        asan = (asan ~= "" and asan .. ":" or "") ..
            "quarantine_size_mb=0:thread_local_quarantine_size_kb=0:malloc_context_size=0"
        local srv = server.start { app = APP, workers = 1, tls = true, start_timeout = 20, stop_timeout = 15,
            args = { "--http3", "--keepalive-timeout-ms", "120000", "--limit", "h3_retry_above=100000" },
            env = { ASAN_OPTIONS = asan } }
        local holds = {}
        finally(function()
            for _, h in ipairs(holds) do os.execute("kill " .. h.pid .. " 2>/dev/null") end
            srv:stop()
        end)
        local url = string.format("https://127.0.0.1:%d/", h3.quic_port(srv))
        local load = server.sh_quote(h3.tool("kh-h3load"))
        -- n connections held idle by a kh-h3load of their own; returns it once they all are
        local function hold(n)
            local h = { log = srv.dir .. "/hold" .. (#holds + 1) .. ".out" }
            local p = io.popen(string.format("%s -c %d -n %d -m 1 --ramp 20 --hold 120 -t 60 %s >%s 2>&1 & echo $!",
                load, n, n, url, server.sh_quote(h.log)))
            h.pid = tonumber(p:read("*l"))
            p:close()
            holds[#holds + 1] = h
            local held
            for _ = 1, 1200 do
                held = (server.read_file(h.log) or ""):match("held: (%d+) connections idle")
                if held then break end
                os.execute("sleep 0.1")
            end
            assert.are.equal(n, tonumber(held), server.read_file(h.log))
            os.execute("sleep 0.5")
            return h
        end
        -- WARM connections first, held too: the worker's first ones allocate what every later one
        -- reuses (Lua, buffers, the heap's first growth); the figure is the slope after them
        hold(WARM)
        local before = anon_kib(srv.pid)
        assert.truthy(before and before > 0)
        hold(N)
        local after = anon_kib(srv.pid)
        for _, h in ipairs(holds) do
            -- still held when read: not yet released, and none of the connections closed
            local log = server.read_file(h.log) or ""
            assert.falsy(log:find("released"), log)
            assert.falsy(log:find("connection %d+:"), log)
        end
        local per = (after - before) * 1024 / N
        print(string.format("\n  h3: %d + %d idle connections, RssAnon %d -> %d KiB, %d bytes each",
            WARM, N, before, after, math.floor(per)))
        assert.is_true(per > FLOOR, "less than " .. FLOOR .. " bytes per connection: not the server's memory?")
        assert.is_true(per < BOUND, string.format("%d bytes per idle h3 connection", math.floor(per)))
        -- SIGUSR1: kh-h3load closes them (CONNECTION_CLOSE each), so the stop has none to close
        for _, h in ipairs(holds) do
            os.execute("kill -USR1 " .. h.pid)
            for _ = 1, 300 do
                if (server.read_file(h.log) or ""):find("released") then break end
                os.execute("sleep 0.1")
            end
            assert.truthy((server.read_file(h.log) or ""):find("released"), server.read_file(h.log))
        end
    end)
end)
