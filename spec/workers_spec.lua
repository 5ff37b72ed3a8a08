-- Workers and listeners: --workers N spreads new connections over every worker
-- (SO_REUSEPORT), one "listening on" line per --listen address, IPv6, several addresses.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/w", function() return tostring(k.worker_id()) end)
]]

describe("workers", function()
    local srv
    setup(function()
        srv = server.start { app = APP, workers = 2 }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    it("prints one listening line per address, after all workers loaded", function()
        local n = 0
        for _ in srv:log():gmatch("listening on 127%.0%.0%.1:%d+ %(tcp%)") do n = n + 1 end
        assert.are.equal(1, n, srv:log())
    end)

    it("spreads 200 new connections over both workers", function()
        local seen = {}
        for i = 1, 200 do
            local r, err = srv:raw_request { path = "/w" }
            assert.truthy(r, "request " .. i .. " failed: " .. tostring(err))
            assert.are.equal(200, r.status)
            seen[r.body] = (seen[r.body] or 0) + 1
        end
        for id in pairs(seen) do
            assert.truthy(id == "0" or id == "1", "worker_id out of 0..1: " .. id)
        end
        assert.truthy(seen["0"], "worker 0 never answered")
        assert.truthy(seen["1"], "worker 1 never answered")
    end)

    it("answers through curl on every worker", function()
        for _ = 1, 10 do
            local r = srv:request { path = "/w" }
            assert.are.equal(200, r.status)
            assert.truthy(r.body == "0" or r.body == "1", r.body)
        end
    end)
end)

describe("listeners", function()
    it("serve IPv6 on [::1]:0", function()
        if not server.has_ipv6_loopback() then
            pending("::1 is not configured on this machine")
            return
        end
        local srv = server.start { app = APP, listen = { "[::1]:0" } }
        local ok, err = pcall(function()
            assert.are.equal("[::1]", srv.listens[1].host)
            local r = srv:request { path = "/w" }
            assert.are.equal(200, r.status, r.err)
            assert.are.equal("0", r.body)
            local r2 = assert(srv:raw_request { path = "/w" })
            assert.are.equal(200, r2.status)
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("serve two --listen addresses, each with its own port", function()
        local srv = server.start { app = APP, listen = { "127.0.0.1:0", "127.0.0.1:0" }, workers = 2 }
        local ok, err = pcall(function()
            assert.are.equal(2, #srv.listens)
            assert.are_not.equal(srv.listens[1].port, srv.listens[2].port)
            for _, l in ipairs(srv.listens) do
                local r = srv:request { path = "/w", listen = l }
                assert.are.equal(200, r.status, r.err)
                local r2 = assert(srv:raw_request { path = "/w", listen = l })
                assert.are.equal(200, r2.status)
            end
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("serve an IPv4 and an IPv6 address together", function()
        if not server.has_ipv6_loopback() then
            pending("::1 is not configured on this machine")
            return
        end
        local srv = server.start { app = APP, listen = { "127.0.0.1:0", "[::1]:0" } }
        local ok, err = pcall(function()
            assert.are.equal(2, #srv.listens)
            for _, l in ipairs(srv.listens) do
                local r = srv:request { path = "/w", listen = l }
                assert.are.equal(200, r.status, l.addr .. ": " .. tostring(r.err))
            end
        end)
        srv:stop()
        assert(ok, err)
    end)
end)
