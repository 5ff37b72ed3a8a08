-- spec/send_to_spec.lua: k.send_to (issue 10, item 5, SSE side): an SSE stream kept open after
-- its handler (`return sse`) is written to from another request, a timer, a pool result and
-- another worker (through the worker mailbox); k.send_to never yields; a slow consumer past
-- stream_out_cap is ended (never buffered without bound) while a k.publish broadcast still
-- reaches every other stream in full.
local server = require "spec.helpers.server"

local APP = [[
local k = require "khamsin"
local shared = k.shared_dict("st", 4 * 1024 * 1024)
local streams = {} -- this worker's held streams
k.get("/hold", function(req, res)
  local sse = res:sse()
  sse:send{event = "id", data = sse.id}
  streams[sse.id] = true
  sse:on_close(function(s, why)
    streams[sse.id] = nil
    shared:set("closed_" .. sse.id, why)
  end)
  return sse
end)
k.get("/push", function(req)
  local ok, err = k.send_to(req.args.id, {event = "push", data = req.args.data})
  return tostring(ok) .. " " .. tostring(err)
end)
k.get("/timer", function(req)
  local id = req.args.id
  k.timer(0.05, function() k.send_to(id, "from a timer") end)
  return "ok"
end)
k.get("/pool", function(req)
  local v = k.blocking(function() return "from the pool" end)
  return tostring(k.send_to(req.args.id, v))
end)
local function owner(id) return tonumber(id:match("^(%d+)%-")) end
k.subscribe("xw", function(id)
  if owner(id) ~= k.worker_id() then k.send_to(id, "from worker " .. k.worker_id()) end
end)
k.get("/xworker", function(req)
  k.publish("xw", req.args.id)
  return "ok"
end)
k.subscribe("all", function(m)
  local piece = string.rep("b", 1000)
  for i = 1, m.n do
    for id in pairs(streams) do k.send_to(id, {event = "b" .. m.round .. "-" .. i, data = piece}) end
  end
end)
k.get("/broadcast", function(req)
  k.publish("all", {round = tonumber(req.args.round), n = tonumber(req.args.n)})
  return "ok"
end)
k.get("/flood", function(req)
  if owner(req.args.id) ~= k.worker_id() then return "other worker" end
  local piece = string.rep("f", 1000)
  local sent = 0
  for i = 1, tonumber(req.args.n) do
    local ok, err = k.send_to(req.args.id, {data = piece})
    if not ok then return sent .. " " .. tostring(err) end
    sent = sent + 1
  end
  return sent .. " all"
end)
k.get("/get/:k", function(req) return tostring(shared:get(req.params.k)) end)
]]

-- A reader in the background: curl -N into a file; returns a function giving the file's text.
local function reader(srv, proto, n)
    local file = srv.dir .. "/sse" .. n .. ".out"
    local flag = proto == "h2c" and "--http2-prior-knowledge" or "--http1.1"
    os.execute("curl -s -N " .. flag .. " --max-time 600 " .. server.sh_quote(srv:url("/hold"))
        .. " > " .. file .. " 2>/dev/null &")
    return function() return server.read_file(file) or "" end
end

local function stream_id(text)
    local id = server.wait_until(10, function() return text():match("event: id\ndata: (%d+%-%d+%-%d+)\n\n") end)
    assert(id, "no id event")
    return id
end

describe("k.send_to", function()
    local srv
    setup(function()
        srv = server.start { app = APP, tls = false, workers = 2,
            args = { "--stream-out-cap", "65536", "--sse-keepalive-ms", "0" } }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    for i, proto in ipairs { "h1", "h2c" } do
        it("writes to a held SSE stream from a request, a timer, the pool and another worker (" .. proto .. ")", function()
            local text = reader(srv, proto, i)
            local id = stream_id(text)
            -- requests land on either worker: same worker or by the mailbox
            for j = 1, 4 do
                assert.are.equal("true nil", srv:request { path = "/push?id=" .. id .. "&data=hello" .. j }.body)
            end
            assert.are.equal("ok", srv:request { path = "/timer?id=" .. id }.body)
            srv:request { path = "/pool?id=" .. id }
            assert.are.equal("ok", srv:request { path = "/xworker?id=" .. id }.body)
            local other = tonumber(id:match("^(%d+)")) == 0 and 1 or 0
            local ok = server.wait_until(10, function()
                local t = text()
                return t:find("event: push\ndata: hello4\n\n", 1, true)
                    and t:find("data: from a timer\n\n", 1, true)
                    and t:find("data: from the pool\n\n", 1, true)
                    and t:find("data: from worker " .. other .. "\n\n", 1, true)
            end)
            assert.truthy(ok, text())
            for j = 1, 4 do assert.truthy(text():find("data: hello" .. j .. "\n", 1, true)) end
        end)
    end

    it("an unknown or malformed id: nil, 'gone' / an error", function()
        local r = srv:request { path = "/push?id=0-1-999999&data=x" }
        local r2 = srv:request { path = "/push?id=1-1-999999&data=x" }
        -- on the id's own worker "gone"; posted to the other worker: true (delivery finds nothing)
        assert.truthy((r.body == "nil gone" or r.body == "true nil") and (r2.body == "nil gone" or r2.body == "true nil"))
        srv:expect_error("is not a stream id")
        assert.are.equal(500, srv:request { path = "/push?id=nope&data=x" }.status)
    end)

    it("ends a slow consumer past stream_out_cap; the broadcast still reaches the others in full", function()
        -- a slow consumer: reads the head and the id event, then nothing
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        c.sock:settimeout(5)
        c.sock:send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        local got = ""
        local slow_id
        while not slow_id do
            local d, err, part = c.sock:receive(1)
            got = got .. (d or part or "")
            assert(not err or err == "timeout", err)
            slow_id = got:match("event: id\r?\ndata: (%d+%-%d+%-%d+)\n\n")
        end
        -- a fast one
        local text = reader(srv, "h1", 10)
        local fast_id = stream_id(text)
        -- 100 rounds of 40 events of 1 KB to every stream of every worker (40 KB a round, under
        -- the 64 KiB stream_out_cap): 4 MB each (more than loopback's socket buffers take); the
        -- fast reader keeps up, the slow one cannot
        for round = 1, 100 do
            assert.are.equal("ok", srv:request { path = "/broadcast?n=40&round=" .. round }.body)
            server.wait_until(5, function() return text():find("event: b" .. round .. "%-40\n") end, 0.005)
        end
        local why = server.wait_until(20, function()
            local g = srv:request { path = "/get/closed_" .. slow_id }.body
            return g ~= "nil" and g
        end)
        assert.are.equal("slow consumer", why)
        local all = server.wait_until(30, function()
            return text():find("event: b100-40\ndata: ", 1, true)
        end)
        assert.truthy(all, "the fast stream did not get the whole broadcast")
        local _, n = text():gsub("event: b%d+%-%d+\n", "")
        assert.are.equal(4000, n)
        assert.are.equal("nil", srv:request { path = "/get/closed_" .. fast_id }.body)
        c.sock:close()
    end)

    it("k.send_to never yields: a flood ends the slow consumer at once, not after waiting", function()
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        c.sock:settimeout(5)
        c.sock:send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        local got, id = "", nil
        while not id do
            local d, err, part = c.sock:receive(1)
            got = got .. (d or part or "")
            assert(not err or err == "timeout", err)
            id = got:match("event: id\r?\ndata: (%d+%-%d+%-%d+)\n\n")
        end
        -- the flood must run on the stream's own worker to see the "closed" result: retry
        local body
        for _ = 1, 20 do
            body = srv:request { path = "/flood?n=100000&id=" .. id, timeout = 30 }.body
            if body ~= "other worker" then break end
        end
        local sent, err = body:match("^(%d+) (%S+)$")
        assert.are.equal("closed", err, body)
        assert.is_true(tonumber(sent) < 100000)
        c.sock:close()
    end)
end)
