-- Abort safety: a client that leaves while its handler sleeps, waits on the pool, holds a
-- deferred reply or reads a body: the wait is cancelled, the handler's pcall cleanups run with
-- an abort error, nothing is written late, nothing leaks (the ASan build checks at stop).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local log = k.shared_dict("log", 65536)
local function record(name, ok, e)
    log:set(name, ok and "finished" or (k.is_aborted(e) and "aborted" or ("error: " .. tostring(e))))
end
k.get("/sleep", function()
    local ok, e = pcall(k.sleep, 5)
    record("sleep", ok, e)
    -- every later wait raises at once; a reply goes nowhere
    local ok2, e2 = pcall(k.sleep, 0)
    log:set("sleep_again", k.is_aborted(e2) and "aborted" or "waited")
    return "late reply"
end)
k.get("/pool", function(req)
    -- /pool?DIR: the job is held until DIR/release exists (poolmod.hold); /pool: 400 ms
    local ok, e
    if req.query then
        ok, e = pcall(k.blocking, "poolmod.hold", req.query)
    else
        ok, e = pcall(k.blocking, "poolmod.sleep_ms", 400)
    end
    record("pool", ok, e)
    error(e, 0) -- an abort error escapes: not logged as [error]
end)
k.get("/defer", function(req, res)
    local d = res:defer()
    d:on_abort(function() log:set("defer", "aborted") end)
end)
k.post("/body", function(req)
    local ok, e = pcall(req.body, req)
    record("body", ok, e)
end)
k.get("/co", function()
    local co = coroutine.wrap(function() k.sleep(5) end)
    local ok, e = pcall(co)
    record("co", ok, e)
end)
k.get("/pool_ok", function() return tostring(k.blocking("poolmod.add", 1, 2)) end)
k.get("/get/:key", function(req) return tostring(log:get(req.params.key)) end)
]]

describe("a client that leaves", function()
    local srv
    setup(function()
        srv = server.start { app = APP, args = { "--pool-threads", "1" },
            env = { LUA_PATH = server.root .. "/spec/helpers/poolmods/?.lua;;" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    local function leave(req)
        local c = assert(srv:raw_conn())
        c:send(req)
        server.sleep(0.1)
        c:close()
    end

    local function wait_value(key, want)
        local got
        server.wait_until(10, function()
            got = srv:raw_request { path = "/get/" .. key }.body
            return got == want
        end)
        return got
    end

    it("while its handler sleeps: the timer is cancelled and pcall sees an abort", function()
        leave("GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.are.equal("aborted", wait_value("sleep", "aborted"))
        assert.are.equal("aborted", wait_value("sleep_again", "aborted"))
    end)

    it("while it waits on the pool: resumed at once, the late result dropped", function()
        -- the job is held until the spec releases it: the abort must resume the handler while
        -- the job still runs (it had a 0.35 s bound against a 400 ms job: load-sensitive)
        local dir = srv.dir .. "/hold"
        assert(os.execute("mkdir -p " .. dir))
        leave("GET /pool?" .. dir .. " HTTP/1.1\r\nHost: x\r\n\r\n")
        local got = wait_value("pool", "aborted")
        server.write_file(dir .. "/release", "") -- the job ends; its result is dropped
        assert.are.equal("aborted", got)
        assert.are.equal("3", srv:raw_request { path = "/pool_ok", timeout = 10 }.body)
    end)

    it("while it holds a deferred reply: on_abort runs", function()
        leave("GET /defer HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.are.equal("aborted", wait_value("defer", "aborted"))
    end)

    it("while its handler reads the body", function()
        leave("POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
        assert.are.equal("aborted", wait_value("body", "aborted"))
    end)

    it("while a coroutine of the app's own sleeps", function()
        leave("GET /co HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.are.equal("aborted", wait_value("co", "aborted"))
    end)

    it("100 times in a row, all four kinds, leaves the server healthy", function()
        for i = 1, 25 do
            for _, req in ipairs {
                "GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n",
                "GET /pool HTTP/1.1\r\nHost: x\r\n\r\n",
                "GET /defer HTTP/1.1\r\nHost: x\r\n\r\n",
                "POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab",
            } do
                local c = assert(srv:raw_conn())
                c:send(req)
                c:close()
            end
        end
        server.sleep(0.5)
        assert.are.equal("3", srv:raw_request { path = "/pool_ok", timeout = 10 }.body)
    end)
end)
