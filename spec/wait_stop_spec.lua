-- A graceful stop while requests sleep, wait on the pool or hold deferred replies, and while a
-- timer callback sleeps: the server exits 0 after the grace period, with no sanitizer report
-- (leaks included) and no [error] line.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/sleep", function() k.sleep(30) return "never" end)
k.get("/defer", function(req, res) res:defer() end)
k.get("/pool", function() return k.blocking("poolmod.sleep_ms", 1500) end)
k.every(0.05, function() k.sleep(30) end)
k.get("/", function() return "ok" end)
]]

describe("stopping with waits in flight", function()
    it("exits cleanly after the grace period", function()
        local srv = server.start { app = APP, workers = 2, args = { "--grace", "0.3", "--pool-threads", "1" },
            env = { LUA_PATH = server.root .. "/spec/helpers/poolmods/?.lua;;" } }
        local conns = {}
        for _, path in ipairs { "/sleep", "/defer", "/pool", "/sleep", "/defer", "/pool" } do
            local c = assert(srv:raw_conn())
            c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n")
            conns[#conns + 1] = c
        end
        server.sleep(0.2)
        assert.are.equal(200, srv:request { path = "/" }.status)
        srv:stop() -- SIGTERM; fails on a non-zero exit, a sanitizer report or an [error] line
        for _, c in ipairs(conns) do c:close() end
    end)
end)
