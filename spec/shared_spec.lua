-- k.shared: a dictionary shared by all workers, declared at load time with a byte budget.
-- When full, set/add/incr evict expired entries, then the least recently used; an entry larger
-- than the whole budget is refused with nil, "no memory".
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.shared_dict("d", 65536)
k.shared_dict("small", 4096)
local d = k.shared("d")
k.get("/incr", function() return tostring(d:incr("hits", 1, 0)) end)
k.get("/ops", function()
    local out = {}
    local function put(...) local t = {} for i = 1, select("#", ...) do t[i] = tostring((select(i, ...))) end out[#out + 1] = table.concat(t, ",") end
    put(d:set("s", "str"))
    put(d:get("s"))
    put(d:add("s", "x"))
    put(d:add("n", 1.5))
    put(d:get("n"))
    put(d:set("b", false))
    put(d:get("b"))
    put(d:incr("s", 1))
    put(d:incr("missing", 1))
    put(d:incr("n", 2))
    put(d:delete("s"))
    put(d:get("s"))
    put(d:set("ttl", "v", 0.05))
    k.sleep(0.12)
    put(d:get("ttl"))
    return table.concat(out, " | ")
end)
k.get("/full", function()
    local s = k.shared("small")
    local out = {}
    local evicted = 0
    for i = 1, 50 do
        local ok, err, ev = s:set("k" .. i, string.rep("x", 100))
        evicted = evicted + (ev or 0)
    end
    local count, used, cap = s:stats()
    local ok, err = s:set("huge", string.rep("y", 5000))
    return string.format("%s %s %d %d %d %d %s %s", tostring(s:get("k1")), tostring(s:get("k50") ~= nil),
        evicted, count, used <= cap and 1 or 0, cap, tostring(ok), tostring(err))
end)
k.get("/unknown", function() local ok, e = pcall(k.shared, "nope"); return e end)
k.get("/redeclare", function() local ok, e = pcall(k.shared_dict, "d", 8192); return e end)
k.get("/badvalue", function() local ok, e = pcall(d.set, d, "t", {}); return e end)
]]

describe("k.shared", function()
    local srv
    setup(function() srv = server.start { app = APP, workers = 2 } end)
    teardown(function() if srv then srv:stop() end end)

    it("is one dictionary for every worker", function()
        for i = 1, 40 do
            local r = assert(srv:raw_request { path = "/incr" })
            assert.are.equal(tostring(i), r.body)
        end
    end)

    it("get / set / add / incr / delete / ttl", function()
        local r = srv:request { path = "/ops" }
        assert.are.equal(table.concat({
            "true,nil,0", "str", "false,exists", "true,nil,0", "1.5", "true,nil,0", "false",
            "nil,not a number", "nil,not found", "3.5", "true", "nil", "true,nil,0", "nil",
        }, " | "), r.body)
    end)

    it("evicts the least recently used entries when full; refuses one larger than the budget", function()
        local r = srv:request { path = "/full" }
        local k1, k50, evicted, count, within, cap, ok, err =
            r.body:match("^(%S+) (%S+) (%d+) (%d+) (%d) (%d+) (%S+) (.+)$")
        assert.are.equal("nil", k1, r.body)
        assert.are.equal("true", k50, r.body)
        assert.is_true(tonumber(evicted) > 0, r.body)
        assert.are.equal(50 - tonumber(evicted), tonumber(count), r.body)
        assert.are.equal("1", within, r.body)
        assert.are.equal("4096", cap)
        assert.are.equal("nil", ok)
        assert.are.equal("no memory", err)
    end)

    it("names the problem for an unknown dict, a second size, a bad value", function()
        assert.truthy(srv:request { path = "/unknown" }.body:find("no dict named 'nope'"))
        assert.truthy(srv:request { path = "/redeclare" }.body:find("already declared with 65536 bytes"))
        assert.truthy(srv:request { path = "/badvalue" }.body:find("strings, numbers, booleans or nil"))
    end)
end)
