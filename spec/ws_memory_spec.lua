-- spec/ws_memory_spec.lua: what an idle WebSocket costs the server (issue 10 item 8): 2,000 idle
-- h1 cleartext sockets without compression (handshake done, nothing sent), the server's own
-- heap counters read before and after through GET /gc after a full Lua GC: the Lua heap
-- (collectgarbage "count", exact, the same under ASan) and the C heap in use
-- (core.malloc_in_use: glibc mallinfo2, or under ASan the bytes asked for,
-- __sanitizer_get_current_allocated_bytes). Not VmRSS: under ASan it counts redzones, shadow
-- memory and the quarantine, and in any build the allocators' high-water marks, so it says
-- nothing exact about one socket (bench/websocket.sh and bench/streams.sh report it, release
-- build). A warm-up burst (200 sockets opened and closed at the same concurrency) puts the
-- worker's buffer cache and stream pool in the baseline.
-- The bounds (issue 10 item 8): at most 900 B per socket of C + Lua heap (ASan build, 2,000
-- sockets: about 618 + 197 B), C heap at most 700 B (its kh_conn, 440 B, and the compact stream
-- a held h1 tunnel moves into, 232 B: kh_stream_compact, both from the worker's slabs,
-- core/kh_slab.h), Lua heap at most 250 B (the ws object, a userdata of 112 B, its slot in
-- khamsin.push and its entry in the hold registry). The release build at 10,000 sockets:
-- 687 + 228 B, 951 B of VmRSS (bench/websocket.sh); it was 751 + 276 B (1,074 B) with a
-- 160-byte ws object and both structs from malloc, and 995 + 729 B before the compact stream.
-- A lower bound on the C heap (580 B) keeps the check from passing on a counter that counts
-- nothing: the kh_conn and compact stream of 1,800 of the 2,000 sockets (the first 200 reuse
-- the slab objects the warm-up's sockets left free, which the baseline counts). Then one text
-- frame on every 50th socket comes back echoed: an idle socket's reader (a coroutine started
-- by its input, lua/kh_lua_sched.c KH_WAIT_TUNNEL) still runs.
-- And streams held after their handler give their kh_stream back when the client leaves: 200
-- WebSockets, then 200 kept SSE streams (`return sse`), opened and closed three times each; the
-- C heap after the third round is within 30 B per stream of the one after the second (a stream
-- whose hold is not released keeps its kh_stream, 504 B then, out of the pool: a kept SSE
-- stream whose client left did, until stream.on_abort (main) and sse.lua's close_stream each
-- released it; that leak showed on the release build, 544 B per stream opened and closed,
-- but not in this check under ASan, so this guards the release, not that exact regression;
-- with the slabs such a leak grows the stream slab by a 16 KiB block per 35 streams).
-- And 1,000 idle SSE streams (`return sse`, one event sent) at most 1,536 B each, on a server
-- of their own (the WebSockets' kh_conns, free in the slab once they closed, would not count).
-- Client: spec/ws/idle_mem.py (stdlib asyncio).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/ws/idle_mem.py"
local N = 2000

local APP = [[
local k = require "khamsin"
k.websocket("/ws", { message = function(ws, data, binary) ws:send(data, binary) end })
k.get("/sse", function(req, res)
    local sse = res:sse()
    sse:send { data = "hello" }
    return sse -- kept open, idle, after the handler
end)
k.get("/gc", function()
    collectgarbage()
    collectgarbage()
    return string.format("%d %d", collectgarbage("count") * 1024,
        require("khamsin.core").malloc_in_use())
end)
]]

describe("memory per idle WebSocket (h1 cleartext)", function()
    local srv
    setup(function()
        -- the quarantine keeps freed chunks out of reuse, not out of the in-use count; small anyway
        local asan = os.getenv("ASAN_OPTIONS") or ""
        asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
        -- stop_timeout: after "stopped", ASan's leak check walks the heap 2,000 sockets left;
        -- on the loaded box that once took past the default 3 s (exit 137, killed)
        srv = server.start { app = APP, tls = false, workers = 1, stop_timeout = 20,
            env = { ASAN_OPTIONS = asan } }
    end)
    teardown(function() if srv then srv:stop() end end)

    it("2,000 idle sockets cost at most 900 B each of C + Lua heap, and still echo", function()
        local p = assert(io.popen(string.format("ulimit -n 8192 2>/dev/null; %s %s %d /ws 200 %d 2>&1",
            PY, CLIENT, srv.port, N), "r"))
        local out = p:read("*a")
        p:close()
        local ok, r = pcall(cjson.decode, out:match("{.*}") or out)
        assert(ok and type(r) == "table", "client output: " .. out)
        local c = (r.c1 - r.c0) / N
        local lua = (r.lua1 - r.lua0) / N
        print(string.format("\n  idle WebSocket (h1): C heap %.0f B + Lua heap %.0f B = %.0f B per socket",
            c, lua, c + lua))
        assert.are.equal(r.probes, r.echoed)
        assert.is_true(r.probes >= math.floor(N / 50))
        assert.is_true(c >= 580, string.format("C heap per socket %.0f B: below its kh_conn + compact stream", c))
        assert.is_true(c <= 700, string.format("C heap per socket %.0f B > 700 B", c))
        assert.is_true(lua <= 250, string.format("Lua heap per socket %.0f B > 250 B", lua))
        assert.is_true(c + lua <= 900, string.format("%.0f B per idle WebSocket > 900 B", c + lua))
    end)

    it("1,000 idle SSE streams cost at most 1,536 B each of C + Lua heap", function()
        -- An SSE stream is not compacted: its kh_stream (464 B), kh_conn (440 B), and the sse
        -- object; about 1.2 KB in release. A server of its own: the sockets above left their
        -- kh_conns free in the worker's slab, where these would come from uncounted.
        local asan = os.getenv("ASAN_OPTIONS") or ""
        asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
        local srv2 = server.start { app = APP, tls = false, workers = 1, stop_timeout = 20,
            env = { ASAN_OPTIONS = asan } }
        local M = 1000
        local p = assert(io.popen(string.format("ulimit -n 8192 2>/dev/null; %s %s %d /sse 200 %d sse 2>&1",
            PY, CLIENT, srv2.port, M), "r"))
        local out = p:read("*a")
        p:close()
        srv2:stop()
        local ok, r = pcall(cjson.decode, out:match("{.*}") or out)
        assert(ok and type(r) == "table", "client output: " .. out)
        local c = (r.c1 - r.c0) / M
        local lua = (r.lua1 - r.lua0) / M
        print(string.format("\n  idle SSE stream (h1): C heap %.0f B + Lua heap %.0f B = %.0f B per stream",
            c, lua, c + lua))
        assert.is_true(c + lua <= 1536, string.format("%.0f B per idle SSE stream > 1,536 B", c + lua))
    end)
end)

describe("held streams give their kh_stream back", function()
    -- a server of its own for each kind: the stream pool must start empty (2,000 pooled streams
    -- from the test above would hide a leak: new streams would come from the pool, not malloc)
    for _, kind in ipairs { "ws", "sse" } do
        it("a held " .. kind .. " stream gives its stream back when the client leaves", function()
            local asan = os.getenv("ASAN_OPTIONS") or ""
            asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
            local srv = server.start { app = APP, tls = false, workers = 1, stop_timeout = 20,
                env = { ASAN_OPTIONS = asan } }
            local K = 200
            local p = assert(io.popen(string.format("%s %s %d %s churn %d 3 %s 2>&1", PY, CLIENT,
                srv.port, kind == "ws" and "/ws" or "/sse", K, kind), "r"))
            local out = p:read("*a")
            p:close()
            srv:stop()
            local ok, r = pcall(cjson.decode, out:match("%[.*%]") or out)
            assert(ok and type(r) == "table" and #r == 3, "client output: " .. out)
            local growth = (r[3][2] - r[2][2]) / K
            print(string.format("\n  %s: C heap %+.1f B per stream opened and closed (round 3)",
                kind, growth))
            assert.is_true(growth < 30, string.format("C heap grew %.1f B per %s stream", growth, kind))
        end)
    end
end)
