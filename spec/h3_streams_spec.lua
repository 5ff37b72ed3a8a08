-- spec/h3_streams_spec.lua: the stream seam of issue 10 over HTTP/3 (issue 12, item 5): res:write
-- waits on the h3 sink's queue (bytes not yet acknowledged by the peer) and is resumed from the
-- QUIC flush pass, SSE events reach an h3 client while the stream stays open, req:body_reader
-- reads a multi-MB upload whose stream window comes back only as the handler consumes, and a
-- client that leaves ends the SSE stream (send returns nil, "closed"); a k.websocket endpoint
-- answers an extended CONNECT with :protocol websocket (RFC 9220), and one idle for
-- tunnel_idle_timeout_ms is reset. Client: our kh-h3get.
local server = require "spec.helpers.server"

local sh_quote = server.sh_quote
local MB = 1024 * 1024
local bit = require "bit"

local APP = [[
local k = require "khamsin"
local shared = k.shared_dict("h3s", 1024 * 1024)
k.get("/big", function(req, res)
  local n = tonumber(req.args.mb)
  for i = 1, n * 16 do
    local ok, err = res:write(string.format("%08d", i) .. string.rep("x", 65536 - 8))
    if not ok then shared:set("big_err", err) return end
  end
  shared:set("big_done", "yes")
end)
k.post("/upload", function(req, res)
  local total, n = 0, 0
  for chunk in req:body_reader() do
    total = total + #chunk
    n = n + 1
    if n % 8 == 0 then k.sleep(0.001) end -- slower than the client
  end
  return tostring(total)
end, { stream_body = true })
k.get("/events", function(req, res)
  local sse = res:sse()
  assert(sse:send{event = "greet", id = "1", data = "hello h3"})
  k.sleep(0.3)
  assert(sse:send{event = "tick", data = "two"})
  k.sleep(30) -- the stream stays open: the client reads the events before the end
end)
k.get("/until_gone", function(req, res)
  local sse = res:sse()
  local big = string.rep("z", 8192)
  while true do -- send itself waits for the queue to drain
    local ok, err = sse:send{data = big}
    if not ok then shared:set("gone", err) return end
  end
end)
k.get("/held", function(req, res)
  local sse = res:sse()
  sse:send{data = "held"}
  return sse -- held open after the handler, for k.send_to
end)
k.get("/get/:k", function(req) return tostring(shared:get(req.params.k)) end)
k.websocket("/ws", {
  message = function(ws, data) ws:send("echo:" .. data) end,
  close = function(ws, code) shared:set("ws_close", tostring(code)) end,
})
]]

local function h3get_bin()
    return (server.bin():gsub("[^/]+$", "kh-h3get"))
end

local function rss(srv)
    local s = assert(server.read_file("/proc/" .. srv.pid .. "/status"))
    return tonumber(s:match("VmRSS:%s*(%d+) kB")) * 1024
end

-- kh-h3get command line writing the body to out and the head to out .. ".head"
local function h3cmd(srv, port, path, out, args)
    local parts = { sh_quote(h3get_bin()), "-D", sh_quote(out .. ".head"), "-o", sh_quote(out) }
    for _, a in ipairs(args or {}) do parts[#parts + 1] = sh_quote(a) end
    parts[#parts + 1] = sh_quote(string.format("https://127.0.0.1:%d%s", port, path))
    return table.concat(parts, " ") .. " 2>" .. sh_quote(out .. ".err")
end

-- Runs cmd in the background; returns a function that says its exit code once done.
local function background(srv, cmd)
    srv.nbg = (srv.nbg or 0) + 1
    local done = srv.dir .. "/bg" .. srv.nbg .. ".done"
    os.execute("(" .. cmd .. "; echo $? > " .. done .. ") >/dev/null 2>&1 &")
    return function()
        local s = server.read_file(done)
        return s and tonumber(s:match("%d+"))
    end
end

describe("HTTP/3 streams (res:write, SSE, body_reader)", function()
    local srv, port
    -- ASan's quarantine would show freed chunks in VmRSS: keep it small for the RSS check
    local asan = (os.getenv("ASAN_OPTIONS") or "")
    asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
    setup(function()
        srv = server.start { app = APP, tls = true, workers = 1, args = { "--http3" },
            env = { ASAN_OPTIONS = asan } }
        port = tonumber(srv:wait_log("listening on 127%.0%.0%.1:(%d+) %(quic%)", 5))
    end)
    teardown(function() if srv then srv:stop() end end)

    it("res:write of 64 MB arrives whole, in order, with the server's RSS bounded", function()
        local out = srv.dir .. "/big.body"
        local base = rss(srv)
        local done = background(srv, h3cmd(srv, port, "/big?mb=64", out, { "--timeout", "60" }))
        local peak = 0
        local code = server.wait_until(300, function()
            peak = math.max(peak, rss(srv))
            return done()
        end, 0.05)
        assert.are.equal(0, code, server.read_file(out .. ".err"))
        local body = assert(server.read_file(out))
        assert.are.equal(64 * MB, #body)
        for i = 1, 64 * 16, 97 do
            assert.are.equal(string.format("%08d", i), body:sub((i - 1) * 65536 + 1, (i - 1) * 65536 + 8))
        end
        assert.truthy(server.read_file(out .. ".head"):find("^HTTP/3 200"))
        assert.are.equal("yes", srv:request { proto = "h1+tls", path = "/get/big_done" }.body)
        -- without backpressure the handler would queue all 64 MB at once (nghttp3 keeps it
        -- until acknowledged)
        print(string.format("\n  h3: 64 MB streamed, VmRSS +%.1f MB at the peak", (peak - base) / MB))
        assert.is_true(peak - base < 32 * MB,
            string.format("RSS grew by %.1f MB while streaming 64 MB", (peak - base) / MB))
    end)

    it("SSE events reach the client while the stream is still open", function()
        local out = srv.dir .. "/events.body"
        local want = "event: greet\nid: 1\ndata: hello h3\n\nevent: tick\ndata: two\n\n"
        -- the handler keeps the stream open 30 s after the events: the client leaves as soon as
        -- it has them all, so its success within 20 s says they came while the stream was open
        local t0 = os.time()
        local done = background(srv, h3cmd(srv, port, "/events", out,
            { "--leave-after", tostring(#want), "--timeout", "60" }))
        assert.are.equal(0, server.wait_until(25, done), server.read_file(out .. ".err"))
        assert.is_true(os.time() - t0 < 25)
        assert.are.equal(want, server.read_file(out))
        local head = server.read_file(out .. ".head")
        assert.truthy(head:find("^HTTP/3 200"))
        assert.truthy(head:find("content%-type: text/event%-stream"))
    end)

    it("req:body_reader reads a 24 MB upload (the window comes back as it consumes)", function()
        local file = srv.dir .. "/upload.bin"
        os.execute("head -c " .. 24 * MB .. " /dev/urandom > " .. sh_quote(file))
        local out = srv.dir .. "/up.body"
        local done = background(srv, h3cmd(srv, port, "/upload", out,
            { "-X", "POST", "-d", "@" .. file, "--timeout", "60" }))
        local code = server.wait_until(300, done)
        assert.are.equal(0, code, server.read_file(out .. ".err"))
        assert.are.equal(tostring(24 * MB), server.read_file(out))
    end)

    it("a client leaving ends the SSE stream: send returns nil, 'closed'", function()
        local out = srv.dir .. "/gone.body"
        local done = background(srv, h3cmd(srv, port, "/until_gone", out,
            { "--leave-after", "100000", "--timeout", "30" }))
        assert.are.equal(0, server.wait_until(30, done), server.read_file(out .. ".err"))
        local v = server.wait_until(20, function()
            local g = srv:request { proto = "h1+tls", path = "/get/gone" }.body
            return g ~= "nil" and g
        end)
        assert.are.equal("closed", v)
    end)

    it("WebSocket over h3: extended CONNECT (RFC 9220) reaches k.websocket, frames both ways", function()
        -- a masked text frame "hi" (RFC 6455 §5.3: mask 01 02 03 04)
        local frame = srv.dir .. "/ws.frame"
        local f = assert(io.open(frame, "wb"))
        f:write(string.char(0x81, 0x82, 1, 2, 3, 4, bit.bxor(("h"):byte(), 1), bit.bxor(("i"):byte(), 2)))
        f:close()
        local out = srv.dir .. "/ws.body"
        local done = background(srv, h3cmd(srv, port, "/ws", out, { "--protocol", "websocket",
            "-H", "sec-websocket-version: 13", "-d", "@" .. frame, "--leave-after", "9",
            "--timeout", "30" }))
        assert.are.equal(0, server.wait_until(30, done), server.read_file(out .. ".err"))
        assert.truthy(server.read_file(out .. ".head"):find("^HTTP/3 200"), server.read_file(out .. ".head"))
        assert.are.equal(string.char(0x81, 7) .. "echo:hi", server.read_file(out))
        -- the client left without a close frame: the socket ends (1006, no status received)
        local v = server.wait_until(20, function()
            local g = srv:request { proto = "h1+tls", path = "/get/ws_close" }.body
            return g ~= "nil" and g
        end)
        assert.are.equal("1006", v)
    end)

    it("a WebSocket over h3 idle for tunnel_idle_timeout_ms is reset (H3_REQUEST_CANCELLED)", function()
        local srv2 = server.start { app = APP, tls = true, workers = 1,
            args = { "--http3", "--tunnel-idle-timeout-ms", "500", "--keepalive-timeout-ms", "30000" } }
        local port2 = tonumber(srv2:wait_log("listening on 127%.0%.0%.1:(%d+) %(quic%)", 5))
        local frame = srv2.dir .. "/ws.frame"
        local f = assert(io.open(frame, "wb"))
        f:write(string.char(0x81, 0x82, 1, 2, 3, 4, bit.bxor(("h"):byte(), 1), bit.bxor(("i"):byte(), 2)))
        f:close()
        local out = srv2.dir .. "/idle.body"
        local t0 = require("socket").gettime()
        -- the client sends one frame, then nothing, and never leaves by itself (--timeout 30)
        local done = background(srv2, h3cmd(srv2, port2, "/ws", out, { "--protocol", "websocket",
            "-H", "sec-websocket-version: 13", "-d", "@" .. frame, "--timeout", "30" }))
        assert.are.equal(0, server.wait_until(30, done), server.read_file(out .. ".err"))
        local took = require("socket").gettime() - t0
        assert.are.equal(string.char(0x81, 7) .. "echo:hi", server.read_file(out))
        assert.truthy((server.read_file(out .. ".err") or ""):find("reset 0x10c", 1, true),
            server.read_file(out .. ".err"))
        assert.truthy(took >= 0.45 and took < 10, "reset after " .. took .. " s")
        local v = server.wait_until(20, function()
            local g = srv2:request { proto = "h1+tls", path = "/get/ws_close" }.body
            return g ~= "nil" and g
        end)
        assert.are.equal("1006", v) -- no close frame: the stream was reset
        srv2:stop()
    end)

    it("a graceful stop ends a held SSE stream over h3 at once, not after the grace period", function()
        local srv2 = server.start { app = APP, tls = true, workers = 1, args = { "--http3", "--grace", "60" } }
        local port2 = tonumber(srv2:wait_log("listening on 127%.0%.0%.1:(%d+) %(quic%)", 5))
        local out = srv2.dir .. "/held.body"
        local done = background(srv2, h3cmd(srv2, port2, "/held", out, { "--timeout", "90" }))
        -- the stream is open (its event came) and held after its handler returned
        assert.truthy(server.wait_until(30, function()
            return (server.read_file(out) or ""):find("data: held\n\n", 1, true)
        end), server.read_file(out .. ".err"))
        srv2:signal("TERM")
        local code = srv2:wait_exit(30) -- --grace 60: only the reset of the stream ends it sooner
        assert.are.equal(0, code, srv2:log())
        assert.truthy(server.wait_until(20, done))
        srv2:stop()
    end)
end)
