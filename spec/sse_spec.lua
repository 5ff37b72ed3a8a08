-- spec/sse_spec.lua: Server-Sent Events (issue 10, item 3) over HTTP/1.1 (curl -N, raw
-- sockets), HTTP/2 cleartext (nghttp, python3-h2) and TLS: event framing (multi-line data split
-- into data: lines, event/id/retry, comments), CR/LF in event or id refused, the keep-alive
-- comment every sse_keepalive_ms, Last-Event-ID, and the handler learning that the client left
-- (send returns nil, "closed"; a wait raises the abort error).
local server = require "spec.helpers.server"

local APP = [[
local k = require "khamsin"
local shared = k.shared_dict("sse", 1024 * 1024)
k.get("/events", function(req, res)
  local sse = res:sse()
  assert(sse:send{event = "greet", id = "7", retry = 1500, data = "line one\nline two\r\nline three"})
  assert(sse:comment("just a comment"))
  assert(sse:send("plain data"))
  assert(sse:send{data = {n = 1}})
  local ok, e1 = pcall(sse.send, sse, {event = "a\nb", data = "x"})
  local ok2, e2 = pcall(sse.send, sse, {id = "1\r2", data = "x"})
  sse:send{event = "errors", data = tostring(ok) .. " " .. tostring(e1) .. "\n" .. tostring(ok2) .. " " .. tostring(e2)}
  sse:send{event = "last", data = tostring(sse.last_event_id) .. " " .. tostring(req.headers["last-event-id"])}
end)
k.get("/quiet", function(req, res)
  local sse = res:sse()
  sse:send{data = "start"}
  k.sleep(1.2)
  sse:send{data = "end"}
end)
k.get("/until_gone/:tag", function(req, res)
  local sse = res:sse()
  local big = string.rep("z", 8192)
  while true do -- no other wait: send itself waits for the queue to drain
    local ok, err = sse:send{data = big}
    if not ok then shared:set("send_" .. req.params.tag, err) return end
  end
end)
k.get("/wait_gone/:tag", function(req, res)
  local sse = res:sse()
  sse:send{data = "waiting"}
  local ok, e = pcall(k.sleep, 30)
  shared:set("wait_" .. req.params.tag, tostring(k.is_aborted(e)))
  error(e, 0)
end)
k.get("/get/:k", function(req) return tostring(shared:get(req.params.k)) end)
]]

local EXPECTED_HEAD = "event: greet\nid: 7\nretry: 1500\ndata: line one\ndata: line two\ndata: line three\n\n"
    .. ": just a comment\n\n"
    .. "data: plain data\n\n"
    .. 'data: {"n":1}\n\n'

local function check_events(body)
    assert.are.equal(EXPECTED_HEAD, body:sub(1, #EXPECTED_HEAD))
    local rest = body:sub(#EXPECTED_HEAD + 1)
    assert.truthy(rest:find("event: errors\ndata: false ", 1, true), rest)
    assert.truthy(rest:find("event has a CR or LF", 1, true), rest)
    assert.truthy(rest:find("id has a CR or LF", 1, true), rest)
    assert.truthy(rest:find("event: last\ndata: 42 42\n\n", 1, true), rest)
end

local function run(cmd)
    local f = assert(io.popen(cmd))
    local out = f:read("*a")
    f:close()
    return out
end

describe("Server-Sent Events", function()
    local srv
    setup(function()
        srv = server.start { app = APP, workers = 1, args = { "--sse-keepalive-ms", "200" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    for _, proto in ipairs { "h1", "h2c", "h1+tls", "h2" } do
        it("frames events, comments and Last-Event-ID (" .. proto .. ", curl)", function()
            local r = srv:request { path = "/events", proto = proto, headers = { ["Last-Event-ID"] = "42" },
                curl_args = { "-N" } }
            assert.are.equal(200, r.status)
            assert.are.equal("text/event-stream; charset=utf-8", r.headers["content-type"])
            assert.are.equal("no-cache", r.headers["cache-control"])
            assert.is_nil(r.headers["content-length"])
            check_events(r.body)
        end)
    end

    it("frames events over h2 for nghttp too", function()
        local out = run("nghttp -H 'last-event-id: 42' " .. server.sh_quote(srv:url("/events")) .. " 2>&1")
        check_events(out)
    end)

    it("frames events over h2 for python3-h2, which reads them as they come", function()
        local py = [[
import socket, sys, h2.connection, h2.config
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection()
c.send_headers(1, [(":method","GET"),(":scheme","http"),(":path","/quiet"),(":authority","x")], end_stream=True)
s.sendall(c.data_to_send())
body, ended = b"", False
s.settimeout(5)
while not ended:
    d = s.recv(65536)
    if not d: break
    for e in c.receive_data(d):
        n = type(e).__name__
        if n == "DataReceived":
            body += e.data
            c.acknowledge_received_data(e.flow_controlled_length, 1)
        if n == "StreamEnded": ended = True
    s.sendall(c.data_to_send())
sys.stdout.write(body.decode())
]]
        local out = run("/usr/bin/python3 -c " .. server.sh_quote(py) .. " " .. srv.listens[1].port)
        assert.are.equal("data: start\n\n", out:sub(1, 13))
        assert.are.equal("data: end\n\n", out:sub(-11))
        -- 1.2 s quiet with sse_keepalive_ms = 200: keep-alive comments in between
        local _, n = out:gsub(":%s*\n\n", "")
        assert.is_true(n >= 3, "keep-alive comments: " .. n .. " in " .. out)
    end)

    for _, proto in ipairs { "h1", "h2c" } do
        it("sends a keep-alive comment every sse_keepalive_ms (" .. proto .. ")", function()
            local r = srv:request { path = "/quiet", proto = proto, curl_args = { "-N" } }
            assert.are.equal("data: start\n\n", r.body:sub(1, 13))
            assert.are.equal("data: end\n\n", r.body:sub(-11))
            local middle = r.body:sub(14, -12)
            local _, n = middle:gsub(": \n\n", "")
            assert.is_true(n >= 3 and n <= 12, "keep-alive comments: " .. n .. " in " .. middle)
            assert.are.equal((": \n\n"):rep(n), middle)
        end)

        it("send returns nil, 'closed' once the client left (" .. proto .. ")", function()
            local flag = proto == "h1" and "--http1.1" or "--http2-prior-knowledge"
            os.execute("curl -s -N " .. flag .. " --max-time 0.5 -o /dev/null "
                .. server.sh_quote(srv:url("/until_gone/" .. proto)) .. " 2>/dev/null")
            local v = server.wait_until(10, function()
                local g = srv:request { path = "/get/send_" .. proto }.body
                return g ~= "nil" and g
            end)
            assert.are.equal("closed", v)
        end)

        it("a wait raises the abort error once the client left (" .. proto .. ")", function()
            local flag = proto == "h1" and "--http1.1" or "--http2-prior-knowledge"
            os.execute("curl -s -N " .. flag .. " --max-time 0.5 -o /dev/null "
                .. server.sh_quote(srv:url("/wait_gone/" .. proto)) .. " 2>/dev/null")
            local v = server.wait_until(10, function()
                local g = srv:request { path = "/get/wait_" .. proto }.body
                return g ~= "nil" and g
            end)
            assert.are.equal("true", v)
        end)
    end
end)
