-- spec/stream_spec.lua: streamed replies and incremental request bodies (issue 10, items 1-2),
-- and the tunnel seam (item 1) on HTTP/1.1 and HTTP/2 (RFC 8441 extended CONNECT).
-- res:write sends chunked (h1) / DATA (h2), waits while stream_high_water bytes are queued, and
-- returns nil, "closed" once the client left; req:body_reader reads under body_window. The RSS
-- checks stream 200 MB to a client that reads at a limited rate, and upload 200 MB to a handler
-- that reads slower than the client sends: without backpressure either would hold the 200 MB.
local server = require "spec.helpers.server"

local MB = 1024 * 1024

local APP = [[
local k = require "khamsin"
local core = require "khamsin.core"
local shared = k.shared_dict("st", 1024 * 1024)
k.get("/five", function(req, res)
  res.headers["X-Kind"] = "stream"
  for i = 1, 5 do assert(res:write("chunk " .. i .. "\n")) end
end)
k.get("/early", function(req, res)
  res:write("before\n")
  assert(res:finish())
  k.sleep(0.05)
  local ok, err = res:write("after")
  shared:set("early", tostring(ok) .. " " .. tostring(err))
end)
k.get("/big", function(req, res)
  local n = tonumber(req.args.mb)
  local piece = string.rep("x", 65536)
  for i = 1, n * 16 do
    local ok, err = res:write(piece)
    if not ok then shared:set("big_err", err) return end
  end
end)
k.get("/forever", function(req, res)
  local piece = string.rep("y", 16384)
  while true do
    local ok, err = res:write(piece)
    if not ok then shared:set("forever_" .. req.args.tag, err) return end
  end
end)
k.get("/bad", function(req, res) res:write({}) end)
k.get("/returns", function(req, res) res:write("x") return "more" end)
k.post("/upload", function(req, res)
  local total, n = 0, 0
  for chunk in req:body_reader() do
    total = total + #chunk
    n = n + 1
    if n % 8 == 0 then k.sleep(0.001) end -- slower than the client
  end
  return tostring(total)
end, { stream_body = true })
k.post("/small", function(req, res)
  local parts = {}
  for chunk in req:body_reader() do parts[#parts + 1] = chunk end
  return table.concat(parts)
end)
-- the tunnel seam, driven from the core functions the WebSocket module builds on
k.route("@websocket", "/tun", function(req, res)
  local s, g = res._s, res._g
  if req.headers["x-refuse"] then return 403, "no" end
  local proto = core.tunnel(s, g)
  assert(core.respond(s, g, 0, nil, { ["X-Proto"] = proto }, nil, "tunnel"))
  while true do
    local chunk = core.body_chunk(s, g)
    if type(chunk) == "string" then
      core.stream_write(s, g, "echo:" .. chunk, "wait")
    elseif chunk ~= true then
      break
    end
  end
  core.stream_write(s, g, "bye", "wait")
  core.stream_finish(s, g)
  res._streaming, res._finished = true, true
end)
k.get("/tun", function() return "plain\n" end)
k.route("@websocket", "/only", function() return "never" end)
k.get("/get/:k", function(req) return tostring(shared:get(req.params.k)) end)
]]

local function rss(srv)
    local s = assert(server.read_file("/proc/" .. srv.pid .. "/status"))
    return tonumber(s:match("VmRSS:%s*(%d+) kB")) * 1024
end

local CURL = { h1 = "--http1.1", h2c = "--http2-prior-knowledge" }

-- Runs a shell command in the background; returns a function that says its exit code once done.
local function background(srv, cmd)
    srv.nbg = (srv.nbg or 0) + 1
    local done = srv.dir .. "/bg" .. srv.nbg .. ".done"
    os.execute("(" .. cmd .. "; echo $? > " .. done .. ") >/dev/null 2>&1 &")
    return function()
        local s = server.read_file(done)
        return s and tonumber(s:match("%d+"))
    end
end

-- Runs cmd in the background and samples the server's RSS until it ends; returns exit, peak.
local function peak_rss_while(srv, cmd, timeout)
    local finished = background(srv, cmd)
    local peak = 0
    local code = server.wait_until(timeout, function()
        peak = math.max(peak, rss(srv))
        return finished()
    end, 0.05)
    return code, peak
end

local function h2_tunnel(port)
    local py = [[
import socket, sys, h2.connection, h2.config, h2.settings
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection(); s.sendall(c.data_to_send())
def pump(t=1.0, until=None):
    s.settimeout(t); evs = []
    try:
        while True:
            d = s.recv(65536)
            if not d: break
            evs += c.receive_data(d); s.sendall(c.data_to_send())
            if until and any(until(e) for e in evs): break
    except socket.timeout: pass
    return evs
pump(0.5, lambda e: type(e).__name__ == "RemoteSettingsChanged")
print("enable_connect_protocol", c.remote_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL))
c.send_headers(1, [(":method","CONNECT"),(":protocol","websocket"),(":scheme","http"),(":path","/tun"),(":authority","x")])
s.sendall(c.data_to_send())
for e in pump(2, lambda e: type(e).__name__ == "ResponseReceived"):
    if type(e).__name__ == "ResponseReceived": print("status", dict(e.headers)[b":status"].decode(), dict(e.headers).get(b"x-proto", b"").decode())
c.send_data(1, b"hi"); s.sendall(c.data_to_send())
for e in pump(2, lambda e: type(e).__name__ == "DataReceived"):
    if type(e).__name__ == "DataReceived": print("data", e.data.decode())
c.end_stream(1); s.sendall(c.data_to_send())
for e in pump(2, lambda e: type(e).__name__ == "StreamEnded"):
    n = type(e).__name__
    if n == "DataReceived": print("data", e.data.decode())
    if n == "StreamEnded": print("ended")
]]
    local f = assert(io.popen("/usr/bin/python3 -c " .. server.sh_quote(py) .. " " .. port))
    local out = f:read("*a")
    f:close()
    return out
end

describe("streamed replies and bodies", function()
    local srv
    -- ASan keeps freed blocks in a quarantine (256 MB by default), which would show in VmRSS
    -- as if the server held the bytes it streamed: keep it small for the RSS checks
    local asan = (os.getenv("ASAN_OPTIONS") or "")
    asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
    setup(function() srv = server.start { app = APP, tls = false, workers = 1, env = { ASAN_OPTIONS = asan } } end)
    teardown(function() if srv then srv:stop() end end)

    for _, proto in ipairs { "h1", "h2c" } do
        it("res:write streams chunks with no length (" .. proto .. ")", function()
            local r = srv:request { path = "/five", proto = proto }
            assert.are.equal(200, r.status)
            assert.are.equal("chunk 1\nchunk 2\nchunk 3\nchunk 4\nchunk 5\n", r.body)
            assert.are.equal("stream", r.headers["x-kind"])
            assert.is_nil(r.headers["content-length"])
            if proto == "h1" then assert.are.equal("chunked", r.headers["transfer-encoding"]) end
        end)

        it("res:finish ends the response early; a later write says closed (" .. proto .. ")", function()
            local r = srv:request { path = "/early", proto = proto }
            assert.are.equal("before\n", r.body)
            local v = server.wait_until(5, function()
                local g = srv:request { path = "/get/early" }.body
                return g ~= "nil" and g
            end)
            assert.are.equal("nil closed", v)
        end)

        it("res:write returns nil, 'closed' once the client is gone (" .. proto .. ")", function()
            -- curl reads a little of an endless stream, then leaves
            local code = os.execute("curl -s " .. CURL[proto] .. " --max-time 1 -o /dev/null "
                .. server.sh_quote(srv:url("/forever?tag=" .. proto)) .. " 2>/dev/null")
            assert.truthy(code)
            local v = server.wait_until(10, function()
                local g = srv:request { path = "/get/forever_" .. proto }.body
                return g ~= "nil" and g
            end)
            assert.are.equal("closed", v)
        end)

        it("streams 200 MB to a slow reader with the server's RSS bounded (" .. proto .. ")", function()
            -- warm up: the handler, the piece string, the connection buffers
            assert.are.equal(200, srv:request { path = "/big?mb=1", proto = proto, timeout = 30 }.status)
            local base = rss(srv)
            local out = srv.dir .. "/big." .. proto
            local code, peak = peak_rss_while(srv, "curl -s " .. CURL[proto] .. " --limit-rate 40M"
                .. " --max-time 600 -o /dev/null -w '%{size_download}' " .. server.sh_quote(srv:url("/big?mb=200"))
                .. " > " .. out, 650)
            assert.are.equal(0, code)
            assert.are.equal(tostring(200 * MB), server.read_file(out))
            -- without backpressure the handler would queue the whole 200 MB at once
            print(string.format("\n  %s: 200 MB streamed, VmRSS +%.1f MB at the peak", proto, (peak - base) / MB))
            assert.is_true(peak - base < 40 * MB,
                string.format("RSS grew by %.1f MB while streaming 200 MB", (peak - base) / MB))
        end)

        it("req:body_reader takes a 200 MB upload with the server's RSS bounded (" .. proto .. ")", function()
            local file = srv.dir .. "/upload.bin"
            os.execute("truncate -s " .. 200 * MB .. " " .. file)
            local base = rss(srv)
            local out = srv.dir .. "/up." .. proto
            local code, peak = peak_rss_while(srv, "curl -s " .. CURL[proto] .. " --max-time 600 -X POST"
                .. " -T " .. file .. " -H 'Expect:' " .. server.sh_quote(srv:url("/upload")) .. " > " .. out, 650)
            assert.are.equal(0, code)
            assert.are.equal(tostring(200 * MB), server.read_file(out))
            print(string.format("\n  %s: 200 MB uploaded through body_reader, VmRSS +%.1f MB at the peak", proto, (peak - base) / MB))
            assert.is_true(peak - base < 40 * MB,
                string.format("RSS grew by %.1f MB while reading a 200 MB upload", (peak - base) / MB))
        end)

        it("req:body_reader reads a small body, chunked too (" .. proto .. ")", function()
            local r = srv:request { method = "POST", path = "/small", body = "hello body", proto = proto }
            assert.are.equal("hello body", r.body)
            if proto == "h1" then
                r = srv:request { method = "POST", path = "/small", body = ("z"):rep(100000), proto = proto,
                    headers = { ["Transfer-Encoding"] = "chunked" } }
                assert.are.equal(("z"):rep(100000), r.body)
            end
        end)
    end

    it("a declared body over body_bytes is 413 unless the route streams its body", function()
        local srv2 = server.start { app = APP, tls = false, args = { "--body-bytes", "1000" } }
        local r = srv2:request { method = "POST", path = "/small", body = ("a"):rep(5000) }
        assert.are.equal(413, r.status)
        r = srv2:request { method = "POST", path = "/upload", body = ("a"):rep(5000) }
        assert.are.equal(200, r.status)
        assert.are.equal("5000", r.body)
        r = srv2:request { method = "POST", path = "/upload", body = ("a"):rep(5000), proto = "h2c" }
        assert.are.equal("5000", r.body)
        srv2:stop()
    end)

    it("res:write misuse and values returned after streaming are errors (500 / reset)", function()
        srv:expect_error("res:write%(chunk%): chunk must be a string")
        assert.are.equal(500, srv:request { path = "/bad" }.status)
        srv:expect_error("returned values after res:write")
        local r = srv:request { path = "/returns" }
        assert.are.equal(200, r.status)
        assert.are.equal("x", r.body)
    end)

    it("tunnel: an h1 GET + Upgrade reaches the @websocket route: 101, bytes both ways, EOF", function()
        local c = assert(srv:raw_conn())
        c.sock:settimeout(5)
        c.sock:send("GET /tun HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        local head = {}
        while true do
            local line = assert(c.sock:receive("*l"))
            if line == "" then break end
            head[#head + 1] = line
        end
        assert.are.equal("HTTP/1.1 101 Switching Protocols", head[1])
        local h = table.concat(head, "\n"):lower()
        assert.truthy(h:find("upgrade: websocket", 1, true))
        assert.truthy(h:find("x-proto: websocket", 1, true))
        c.sock:send("hello")
        assert.are.equal("echo:hello", c.sock:receive(10))
        c.sock:shutdown("send")
        assert.are.equal("bye", c.sock:receive(3))
        local _, err = c.sock:receive(1)
        assert.are.equal("closed", err)
        c.sock:close()
    end)

    it("tunnel: the same route answers an h2 extended CONNECT (RFC 8441)", function()
        local out = h2_tunnel(srv.listens[1].port)
        assert.truthy(out:find("enable_connect_protocol 1", 1, true), out)
        assert.truthy(out:find("status 200 websocket", 1, true), out)
        assert.truthy(out:find("data echo:hi", 1, true), out)
        assert.truthy(out:find("data bye", 1, true), out)
        assert.truthy(out:find("ended", 1, true), out)
    end)

    it("tunnel routes: a plain GET is routed as usual; a path with only a tunnel route is 426", function()
        assert.are.equal("plain\n", srv:request { path = "/tun" }.body)
        assert.are.equal(426, srv:request { path = "/only" }.status)
        -- an Upgrade the app refuses is an ordinary answer
        local r = srv:request { path = "/tun", headers = { Upgrade = "websocket", Connection = "Upgrade", ["X-Refuse"] = "1" } }
        assert.are.equal(403, r.status)
    end)
end)
