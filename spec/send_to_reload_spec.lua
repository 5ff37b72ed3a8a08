-- spec/send_to_reload_spec.lua: k.send_to after a hot reload (issue 10 / issue 11). A stream
-- opened before a SIGHUP stays with the instance that served it (the retired one); its id names
-- that instance ("<worker>-<generation>-<n>"), so a k.send_to from the new code, on either
-- worker, reaches it through the worker's mailbox (routed by generation), until it closes.
-- Clients: curl -N (SSE over HTTP/1.1 and h2c), python3-websockets (WebSocket).
local server = require "spec.helpers.server"

local function app(version)
    return ([[
local k = require "khamsin"
local V = "%s"
k.get("/events", function(req, res)
  local sse = res:sse()
  sse:send{event = "id", data = sse.id}
  return sse
end)
k.websocket("/ws", { open = function(ws) ws:send("id " .. ws.id) end })
k.get("/send", function(req)
  local ok, err = k.send_to(req.args.id, V .. ":" .. req.args.data)
  return tostring(ok) .. " " .. tostring(err)
end)
k.get("/v", function() return V end)
]]):format(version)
end

local WS_CLIENT = [[
import asyncio, os, sys, time, websockets
async def main(url, out, stop):
    async with websockets.connect(url, compression=None) as ws:
        with open(out, "w") as f:
            for _ in range(5):
                f.write(await asyncio.wait_for(ws.recv(), 60) + "\n")
                f.flush()
        t = time.time()
        while not os.path.exists(stop) and time.time() - t < 60:
            await asyncio.sleep(0.05)
    # leaves (close frame) once told
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
]]

describe("k.send_to after a hot reload", function()
    local srv
    after_each(function()
        if srv then srv:stop() end
        srv = nil
    end)

    it("reaches SSE streams and a WebSocket the old instance holds, from the new code", function()
        srv = server.start { app = app("v1"), tls = false, workers = 2, args = { "--sse-keepalive-ms", "300" } }
        local files, ids, pids = {}, {}, {}
        for i, flag in ipairs { "--http1.1", "--http2-prior-knowledge" } do
            files[i] = srv.dir .. "/sse" .. i .. ".out"
            os.execute("curl -s -N " .. flag .. " --max-time 60 " .. server.sh_quote(srv:url("/events"))
                .. " > " .. files[i] .. " 2>/dev/null & echo $! > " .. files[i] .. ".pid")
            pids[i] = server.wait_until(5, function()
                return (server.read_file(files[i] .. ".pid") or ""):match("^(%d+)")
            end)
        end
        local stop = srv.dir .. "/ws.stop"
        local py = srv.dir .. "/ws.py"
        server.write_file(py, WS_CLIENT)
        files[3] = srv.dir .. "/ws.out"
        os.execute("/usr/bin/python3 " .. py .. " " .. server.sh_quote(srv:url("/ws"):gsub("^http", "ws"))
            .. " " .. files[3] .. " " .. stop .. " >" .. files[3] .. ".err 2>&1 &")
        local function text(i) return server.read_file(files[i]) or "" end
        for i = 1, 3 do
            ids[i] = server.wait_until(10, function()
                return text(i):match(i < 3 and "event: id\ndata: (%d+%-%d+%-%d+)\n\n" or "^id (%d+%-%d+%-%d+)\n")
            end)
            assert.truthy(ids[i], "no id from client " .. i .. ": " .. text(i))
            assert.truthy(ids[i]:match("^%d+%-1%-%d+$"), ids[i]) -- generation 1
        end

        server.write_file(srv.app_path, app("v2"))
        local mark = srv:log_size()
        srv:signal("HUP")
        srv.signaled = nil
        assert.truthy(srv:wait_log("reload: generation 2 on 2 workers", 10, mark))
        assert.are.equal("v2", srv:request { path = "/v" }.body)

        -- from the new code, on whichever worker the request lands: posted (other worker, or
        -- the retired instance of this one), delivered by the instance that holds the stream
        for j = 1, 4 do
            for i = 1, 3 do
                local r = srv:request { path = "/send?id=" .. ids[i] .. "&data=m" .. j }
                assert.are.equal("true nil", r.body)
            end
        end
        for i = 1, 3 do
            local ok = server.wait_until(10, function()
                local t = text(i)
                for j = 1, 4 do
                    if not t:find((i < 3 and "data: v2:m" or "v2:m") .. j .. "\n", 1, true) then return false end
                end
                return true
            end)
            assert.truthy(ok, "client " .. i .. " got: " .. text(i))
        end
        -- the old instance of each worker holding a stream serves it all along, and is closed
        -- once they end (the SSE keep-alive, which goes on in a retired instance, finds an
        -- HTTP/1.1 client gone); a send to a stream of a closed instance is posted and dropped
        local log = srv:log():sub(mark + 1)
        local holders = {}
        for i = 1, 3 do holders[ids[i]:match("^%d+")] = true end
        for w in pairs(holders) do
            assert.is_nil(log:match("w" .. w .. ": reload: generation 1 closed"))
        end
        for i = 1, 2 do os.execute("kill " .. pids[i]) end -- the curls this spec started
        server.write_file(stop, "")
        for w in pairs(holders) do
            assert.truthy(srv:wait_log("w" .. w .. ": reload: generation 1 closed", 15, mark),
                "w" .. w .. " (ids " .. table.concat(ids, " ") .. "):\n" .. srv:log():sub(mark + 1))
        end
        assert.are.equal("true nil", srv:request { path = "/send?id=" .. ids[1] .. "&data=late" }.body)
        assert.are.equal("v2", srv:request { path = "/v" }.body)
    end)
end)
