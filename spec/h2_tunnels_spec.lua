-- spec/h2_tunnels_spec.lua: long-lived streams sharing one HTTP/2 connection (issue 10).
--  * A slow consumer (its stream window never given back) that k.send_to pushes past
--    stream_out_cap is reset (RST_STREAM CANCEL: its queued bytes are dropped) as soon as the end
--    is queued, not left until a timeout: the app hears it at once (the WebSocket's close
--    callback runs with 1008; the SSE stream ends) and later streams of the connection work.
--  * tunnel_idle_timeout_ms is per tunnel: of two WebSockets on one connection, the idle one is
--    reset while the other, active, goes on.
-- Client: spec/h2/tunnels.py (python3-h2; frames read with python3-wsproto).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/h2/tunnels.py"
local CANCEL = 8

local APP = [[
local k = require "khamsin"
local last, closed
k.websocket("/ws", {
  open = function(ws) last = ws.id end,
  message = function(ws, data) ws:send("echo:" .. data) end,
  close = function(ws, code) closed = tostring(code) end,
})
k.get("/events", function(req, res)
  local sse = res:sse()
  last = sse.id
  sse:on_close(function(s, why) closed = why end)
  return sse
end)
k.get("/flood", function(req)
  local piece = string.rep("f", 1000)
  for i = 1, tonumber(req.args.n) do
    local ok, err = k.send_to(last, piece)
    if not ok then return i .. " " .. tostring(err) end
  end
  return "all"
end)
k.get("/closed", function() return tostring(closed) end)
]]

local function run(srv, ...)
    local args = { PY, CLIENT }
    for _, a in ipairs { ... } do args[#args + 1] = server.sh_quote(tostring(a)) end
    local f = io.popen(table.concat(args, " ") .. " 2>&1")
    local out = f:read("*a")
    f:close()
    local ok, r = pcall(cjson.decode, out)
    assert(ok and type(r) == "table", "client output: " .. out .. "\n--- server log:\n" .. srv:log())
    return r
end

describe("HTTP/2 long-lived streams", function()
    local srv
    after_each(function()
        if srv then srv:stop() end
        srv = nil
    end)

    it("resets a slow WebSocket consumer past stream_out_cap at once; the app frees it", function()
        srv = server.start { app = APP, tls = false,
            args = { "--stream-out-cap", "65536", "--tunnel-idle-timeout-ms", "60000" } }
        local r = run(srv, "slow", srv.port, "ws")
        assert.are.equal("all", r.first, cjson.encode(r))
        -- the window was used up: 64 KiB queued, then the cap: the rest is refused
        local n, why = tostring(r.flood):match("^(%d+) (%a+)$")
        assert.truthy(n and tonumber(n) < 400 and why == "closed", cjson.encode(r))
        assert.are.equal(CANCEL, r.reset, cjson.encode(r))
        assert.is_false(r.ended) -- never END_STREAM: it waited behind bytes the peer did not take
        assert.truthy(r.reset_after < 5, cjson.encode(r))
        -- the reader woke up (on_abort): the close callback ran, long before any timeout
        assert.are.equal("1008", r.closed, cjson.encode(r))
        assert.truthy(r.closed_after < 8, cjson.encode(r))
        assert.truthy(r.got >= 60000 and r.got <= 65535, cjson.encode(r)) -- the window, no more
    end)

    it("resets a slow SSE consumer past stream_out_cap at once; the connection goes on", function()
        srv = server.start { app = APP, tls = false,
            args = { "--stream-out-cap", "65536", "--sse-keepalive-ms", "0" } }
        local r = run(srv, "slow", srv.port, "sse")
        assert.are.equal("all", r.first, cjson.encode(r))
        local n, why = tostring(r.flood):match("^(%d+) (%a+)$")
        assert.truthy(n and why == "closed", cjson.encode(r))
        assert.are.equal(CANCEL, r.reset, cjson.encode(r))
        assert.is_false(r.ended)
        assert.truthy(r.reset_after < 5, cjson.encode(r))
        assert.are.equal("slow consumer", r.closed, cjson.encode(r)) -- a later stream answered
    end)

    it("resets only the idle WebSocket after tunnel_idle_timeout_ms; the active one goes on", function()
        srv = server.start { app = APP, tls = false, args = { "--tunnel-idle-timeout-ms", "600" } }
        local r = run(srv, "idle", srv.port, 2.5)
        assert.are.equal(CANCEL, r.reset1, cjson.encode(r))
        -- about 0.6 s after it opened (the connection was busy all along with the other one)
        assert.truthy(r.reset1_after >= 0.5 and r.reset1_after < 2.0, cjson.encode(r))
        assert.are.equal(cjson.null, r.reset3, cjson.encode(r))
        assert.truthy(r.sent >= 10, cjson.encode(r))
        assert.are.equal(r.sent, r.echoes, cjson.encode(r))
        assert.are.equal("echo:last", r.last_echo)
        assert.are.equal("1006", r.closed) -- the idle one's close callback (no close frame)
    end)
end)
