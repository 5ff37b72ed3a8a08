-- Deferred replies: res:defer() keeps the request open after the handler returns; d:send answers
-- it from another request, a timer, the pool, or another worker (k.resolve(d.id, ...)); a
-- timeout answers 504; a client that leaves runs d:on_abort; a second send raises.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local ids = k.shared_dict("ids", 65536)
local waiting = {}
k.get("/wait/:name", function(req, res)
    local name = req.params.name
    local d = res:defer { timeout = tonumber(req.args.timeout) }
    waiting[name] = d
    ids:set(name, d.id)
    d:on_abort(function() ids:set("aborted:" .. name, "yes") end)
end)
k.get("/send/:name", function(req)
    local d = waiting[req.params.name]
    if not d then return 404, "nobody waits" end
    waiting[req.params.name] = nil
    assert(d:send(201, "sent to " .. req.params.name, { ["x-from"] = "another request" }))
    local ok, e = pcall(d.send, d, 200, "again")
    return "first ok; second: " .. tostring(ok) .. " " .. tostring(e:match("already sent"))
end)
k.get("/late/:name", function(req)
    local d = waiting[req.params.name]
    local ok, e = d:send(200, "too late")
    return tostring(ok) .. " " .. tostring(e)
end)
k.get("/timer", function(req, res)
    local d = res:defer()
    k.timer(0.05, function() d:send("by a timer") end)
end)
k.get("/pool", function(req, res)
    local d = res:defer()
    k.timer(0, function() d:send({ from = k.blocking(function() return "the pool" end) }) end)
end)
k.get("/twice", function(req, res)
    local d = res:defer()
    local ok, e = pcall(res.defer, res)
    d:send(200, tostring(e)) -- what the handler returns after res:defer() is ignored
end)
k.get("/resolve/:name", function(req)
    local id = ids:get(req.params.name)
    if not id then return 404, "no id yet" end
    if tonumber(id:match("^(%d+):")) == k.worker_id() then return 409, "same worker" end
    return tostring(k.resolve(id, 202, "resolved by worker " .. k.worker_id(), { ["x-by"] = "resolve" }))
end)
k.get("/resolve_local/:name", function(req)
    local id = ids:get(req.params.name)
    return tostring(k.resolve(id, 200, "resolved locally"))
end)
k.get("/get/:key", function(req) return tostring(ids:get(req.params.key)) end)
]]

local function get(srv, path)
    return srv:raw_request { path = path }
end

describe("deferred replies (one worker)", function()
    local srv
    setup(function() srv = server.start { app = APP, args = { "--defer-timeout-ms", "1500" } } end)
    teardown(function() if srv then srv:stop() end end)

    it("stay open after the handler and are answered by another request", function()
        local c = assert(srv:raw_conn())
        c:send("GET /wait/a HTTP/1.1\r\nHost: x\r\n\r\n")
        server.sleep(0.1)
        assert.are.equal("", c.buf)
        local r = get(srv, "/send/a")
        assert.are.equal("first ok; second: false already sent", r.body)
        local resp = assert(c:read_response { timeout = 2 })
        assert.are.equal(201, resp.status)
        assert.are.equal("sent to a", resp.body)
        assert.are.equal("another request", resp.headers["x-from"])
        -- keep-alive goes on after a deferred reply
        c:send("GET /get/a HTTP/1.1\r\nHost: x\r\n\r\n")
        resp = assert(c:read_response { timeout = 2 })
        assert.are.equal(200, resp.status)
        c:close()
    end)

    server.each_protocol(function(proto)
        it("are answered by a timer and by the pool over " .. proto, function()
            assert.are.equal("by a timer", srv:request { proto = proto, path = "/timer" }.body)
            assert.are.equal('{"from":"the pool"}', srv:request { proto = proto, path = "/pool" }.body)
        end)
    end)

    it("are answered by a timer and by the pool", function()
        local r = srv:request { path = "/timer" }
        assert.are.equal("by a timer", r.body)
        r = srv:request { path = "/pool" }
        assert.are.equal('{"from":"the pool"}', r.body)
    end)

    it("are answered by k.resolve on their own worker", function()
        local c = assert(srv:raw_conn())
        c:send("GET /wait/loc HTTP/1.1\r\nHost: x\r\n\r\n")
        server.sleep(0.1)
        assert.are.equal("true", get(srv, "/resolve_local/loc").body)
        assert.are.equal("resolved locally", assert(c:read_response()).body)
        c:close()
    end)

    it("answer 504 past their timeout (res:defer{timeout}, and the default limit)", function()
        local t0 = server.now()
        local r = srv:request { path = "/wait/t?timeout=0.2" }
        assert.are.equal(504, r.status)
        local took = server.now() - t0
        assert.is_true(took >= 0.19 and took < 1.2, "took " .. took)
        t0 = server.now()
        r = srv:request { path = "/wait/t2" }
        assert.are.equal(504, r.status)
        took = server.now() - t0
        assert.is_true(took >= 1.4 and took < 2.5, "default timeout took " .. took)
        -- a send after the timeout says so
        assert.are.equal("nil timeout", get(srv, "/late/t").body)
    end)

    it("run on_abort when the client leaves, and a later send returns nil, 'closed'", function()
        local c = assert(srv:raw_conn())
        c:send("GET /wait/gone HTTP/1.1\r\nHost: x\r\n\r\n")
        server.sleep(0.1)
        c:close()
        local seen = server.wait_until(2, function()
            return get(srv, "/get/aborted:gone").body == "yes"
        end)
        assert.truthy(seen, "on_abort did not run")
        assert.are.equal("nil closed", get(srv, "/late/gone").body)
    end)

    it("refuse a second res:defer()", function()
        local r = srv:request { path = "/twice", timeout = 3 }
        assert.truthy(r.body:find("already called"), r.body)
    end)
end)

describe("deferred replies across workers", function()
    local srv
    setup(function() srv = server.start { app = APP, workers = 2 } end)
    teardown(function() if srv then srv:stop() end end)

    it("are answered from another worker through d.id and k.resolve", function()
        local c = assert(srv:raw_conn())
        c:send("GET /wait/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.truthy(server.wait_until(2, function() return get(srv, "/get/x").body ~= "nil" end))
        local answered
        for _ = 1, 100 do -- new connections until one lands on the other worker
            local r = get(srv, "/resolve/x")
            if r.status == 200 then answered = r break end
        end
        assert.truthy(answered, "no connection reached the other worker")
        assert.are.equal("true", answered.body)
        local resp = assert(c:read_response { timeout = 2 })
        assert.are.equal(202, resp.status)
        assert.truthy(resp.body:match("^resolved by worker %d$"), resp.body)
        assert.are.equal("resolve", resp.headers["x-by"])
        c:close()
    end)
end)
