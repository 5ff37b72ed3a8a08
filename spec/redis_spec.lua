-- Debian's lua-redis (redis-lua 2.0.x, written for luasocket) runs unchanged inside handlers on
-- k.socket (issue 14, item 2): package.loaded.socket = k.socket.luasocket{...}. A real
-- redis-server (started and stopped here, on a free port), 3,000 requests with 1,000 at once
-- (h2load, one connection each) that each SET, GET and INCR through lua-redis with pooled
-- connections; then: no request failed, every INCR landed, each worker's connections to redis
-- stayed within the pool size, and a non-redis route answered fast during the load.
local server = require "spec.helpers.server"
local socket = require "socket"

local POOL = 20
local TOTAL, CONCURRENT = 3000, 1000

local sh = require("spec.helpers.shell").out

local free_port = server.free_port

local APP = [[
local k = require "khamsin"
package.loaded.socket = k.socket.luasocket { pool_size = {POOL}, backlog = 5000 }
local redis = require "redis"
local PORT = {PORT}

k.get("/r/:i", function(req)
    local c = redis.connect("127.0.0.1", PORT)
    local key = "key:" .. req.params.i
    assert(c:set(key, req.params.i))
    local v = c:get(key)
    local n = c:incr("hits")
    assert(c.network.socket:setkeepalive())
    return v .. " " .. n
end)
k.get("/fast", function() return "fast" end)
k.get("/stats", function()
    return k.json.encode { worker = k.worker_id(), stats = k.socket.stats() }
end)
]]

describe("lua-redis on k.socket", function()
    local dir, rport, rpid, srv

    setup(function()
        dir = sh("mktemp -d /tmp/kspec.XXXXXX"):match("(%S+)")
        assert(dir and dir:match("^/tmp/kspec%."), "mktemp failed")
        rport = free_port()
        os.execute(string.format("redis-server --port %d --bind 127.0.0.1 --save '' "
            .. "--appendonly no --daemonize no --dir %s --maxclients 4000 >%s/redis.log 2>&1 "
            .. "</dev/null & echo $! >%s/redis.pid", rport, dir, dir, dir))
        rpid = server.wait_until(5, function()
            return (server.read_file(dir .. "/redis.pid") or ""):match("(%d+)")
        end, 0.05)
        assert(rpid, "redis-server did not start")
        local up = server.wait_until(10, function()
            return sh("redis-cli -p " .. rport .. " ping 2>/dev/null"):match("PONG")
        end, 0.1)
        assert(up, "redis-server does not answer: " .. tostring(server.read_file(dir .. "/redis.log")))
        srv = server.start { app = (APP:gsub("{PORT}", rport):gsub("{POOL}", POOL)), workers = 2,
            tls = false }
    end)

    teardown(function()
        if srv then srv:stop() end
        if rpid then
            os.execute("kill " .. rpid .. " 2>/dev/null")
            server.wait_until(5, function()
                return os.execute("kill -0 " .. rpid .. " 2>/dev/null") ~= 0
                    and os.execute("kill -0 " .. rpid .. " 2>/dev/null") ~= true
            end, 0.05)
        end
        if dir then os.execute("rm -rf " .. server.sh_quote(dir)) end
    end)

    it("one request: SET, GET, INCR through redis-lua", function()
        local res = srv:request { path = "/r/7" }
        assert.are.equal(200, res.status, res.body)
        assert.are.equal("7 1", res.body)
        sh("redis-cli -p " .. rport .. " set hits 0")
    end)

    it(TOTAL .. " requests, " .. CONCURRENT .. " at once: none failed, every INCR counted, "
        .. "redis connections per worker <= pool size, /fast answers fast meanwhile", function()
        local urls = {}
        for i = 1, 10 do urls[i] = string.format("http://127.0.0.1:%d/r/%d", srv.port, i) end
        local out_path = dir .. "/h2load.out"
        os.execute(string.format("timeout 120 h2load --h1 -n %d -c %d -t 1 %s >%s 2>&1 "
            .. "</dev/null & echo $! >%s/h2load.pid", TOTAL, CONCURRENT, table.concat(urls, " "),
            out_path, dir))
        local hpid = server.wait_until(5, function()
            return (server.read_file(dir .. "/h2load.pid") or ""):match("(%d+)")
        end, 0.02)
        assert(hpid)
        local function running()
            local r = os.execute("kill -0 " .. hpid .. " 2>/dev/null")
            return r == 0 or r == true
        end
        -- wait until the load is on (redis counts hits), then probe the other route
        local on = server.wait_until(30, function()
            local n = tonumber(sh("redis-cli -p " .. rport .. " get hits"):match("(%d+)"))
            return n and n >= 100
        end, 0.02)
        assert.truthy(on, "the load did not start")
        local probes, slowest = 0, 0
        while running() and probes < 20 do
            local t0 = socket.gettime()
            local res = srv:request { path = "/fast", timeout = 10 }
            local dt = socket.gettime() - t0
            -- a probe that ended after the load did not measure anything
            if running() then
                assert.are.equal(200, res.status)
                assert.are.equal("fast", res.body)
                probes = probes + 1
                if dt > slowest then slowest = dt end
            end
        end
        assert.truthy(probes >= 3, "only " .. probes .. " probes ran during the load "
            .. "(the load ended too soon to show anything)")
        assert.truthy(slowest < 2.5, string.format("/fast took %.3f s during the load", slowest))
        server.wait_until(120, function() return not running() end, 0.1)
        local out = server.read_file(out_path) or ""
        assert.matches(TOTAL .. " succeeded, 0 failed, 0 errored", out, 1, true)
        assert.matches("status codes: " .. TOTAL .. " 2xx", out, 1, true)
        local hits = tonumber(sh("redis-cli -p " .. rport .. " get hits"):match("(%d+)"))
        assert.are.equal(TOTAL, hits)
        -- each worker's counters (new connections land on either worker)
        local seen = {}
        server.wait_until(20, function()
            local res = srv:request { path = "/stats" }
            local t = require("cjson").decode(res.body)
            seen[t.worker] = t.stats
            return seen[0] and seen[1]
        end, 0.01)
        local total_connects = 0
        for w = 0, 1 do
            local st = seen[w]
            assert.truthy(st, "no stats from worker " .. w)
            assert.truthy(st.max_open <= POOL, "worker " .. w .. " opened " .. st.max_open
                .. " sockets at once")
            assert.truthy(st.max_idle <= POOL)
            assert.truthy(st.reuses > 0)
            total_connects = total_connects + st.connects
        end
        assert.truthy(total_connects <= 2 * POOL, total_connects .. " connections made")
        local clients = tonumber(sh("redis-cli -p " .. rport .. " info clients")
            :match("connected_clients:(%d+)"))
        assert.truthy(clients <= 2 * POOL + 1, clients .. " redis clients")
        print(string.format("\n    redis spec: %d requests, /fast slowest of %d probes %.3f s, "
            .. "connects %d, redis clients %d", TOTAL, probes, slowest, total_connects, clients))
    end)
end)
