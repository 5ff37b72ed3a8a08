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
local _, redeclared = pcall(k.shared_dict, "d", 8192)
k.get("/redeclare", function() return redeclared end)
k.get("/late", function() local ok, e = pcall(k.shared_dict, "late", 8192); return tostring(ok) .. " " .. e end)
k.get("/replace", function()
    local out = {}
    local function put(...) local t = {} for i = 1, select("#", ...) do t[i] = tostring((select(i, ...))) end out[#out + 1] = table.concat(t, ",") end
    d:delete("r")
    put(d:replace("r", "x"))
    put(d:get("r"))
    d:set("r", "old")
    put(d:replace("r", "new"))
    put(d:get("r"))
    put(d:ttl("r"))
    put(d:ttl("absent"))
    put(d:expire("absent", 5))
    return table.concat(out, " | ")
end)
k.get("/ttl/:key", function(req) return tostring(d:ttl(req.params.key)) end)
k.post("/expire/:key/:s", function(req) return tostring(d:expire(req.params.key, tonumber(req.params.s))) end)
k.post("/set/:key", function(req) return tostring(d:set(req.params.key, "v", tonumber(req.args.ttl))) end)
k.get("/get/:key", function(req) return tostring(d:get(req.params.key)) end)
k.get("/keys", function(req)
    local t = d:get_keys(tonumber(req.args.max))
    return table.concat(t, ",")
end)
k.get("/badkeys", function() local ok, e = pcall(d.get_keys, d, -1); return e end)
k.get("/wait-gone/:key", function(req)
    for _ = 1, 500 do
        if d:get(req.params.key) == nil then return "gone" end
        k.sleep(0.01)
    end
    return "still there"
end)
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

    it("replace only replaces; ttl and expire read and change an entry's expiry", function()
        local r = srv:request { path = "/replace" }
        assert.are.equal("false,not found | nil | true,nil,0 | new | 0 | nil,not found | false,not found", r.body)
        -- across workers: a ttl set on one is seen on the others
        assert.are.equal("true", srv:request { method = "POST", path = "/set/t1?ttl=100" }.body)
        for _ = 1, 4 do
            local left = tonumber(srv:request { path = "/ttl/t1" }.body)
            assert.truthy(left > 90 and left <= 100, left)
        end
        assert.are.equal("true", srv:request { method = "POST", path = "/expire/t1/0" }.body)
        assert.are.equal("0", srv:request { path = "/ttl/t1" }.body)
        assert.are.equal("true", srv:request { method = "POST", path = "/expire/t1/0.05" }.body)
        assert.are.equal("gone", srv:request { path = "/wait-gone/t1" }.body)
        assert.are.equal("nil", srv:request { path = "/ttl/t1" }.body)
        assert.are.equal("false", srv:request { method = "POST", path = "/expire/t1/5" }.body)
    end)

    it("answers the same over h2 and h2c", function()
        for _, proto in ipairs { "h2c", "h2" } do
            local r = srv:request { proto = proto, path = "/replace" }
            assert.are.equal("false,not found | nil | true,nil,0 | new | 0 | nil,not found | false,not found", r.body)
            assert.are.equal("true", srv:request { proto = proto, method = "POST", path = "/set/h?ttl=100" }.body)
            local left = tonumber(srv:request { proto = proto, path = "/ttl/h" }.body)
            assert.truthy(left > 90 and left <= 100, left)
            assert.are.equal("h", srv:request { proto = proto, path = "/keys?max=1" }.body)
        end
    end)

    it("get_keys lists live keys, most recent first, bounded by max", function()
        srv:request { path = "/full" } -- (another dict: untouched here)
        for _, key in ipairs { "ka", "kb", "kc" } do
            srv:request { method = "POST", path = "/set/" .. key }
        end
        srv:request { method = "POST", path = "/set/kx?ttl=0.05" }
        assert.are.equal("gone", srv:request { path = "/wait-gone/kx" }.body)
        local all = srv:request { path = "/keys?max=0" }.body
        assert.truthy(all:find("^kc,kb,ka"), all)
        assert.falsy(all:find("kx", 1, true), all)
        assert.are.equal("kc,kb", srv:request { path = "/keys?max=2" }.body)
        assert.truthy(srv:request { path = "/badkeys" }.body:find("max must be an integer from 0 %(all%) to 1e9"))
    end)

    it("names the problem for an unknown dict, a second size, a bad value", function()
        assert.truthy(srv:request { path = "/unknown" }.body:find("no dict named 'nope'"))
        assert.truthy(srv:request { path = "/redeclare" }.body:find("already declared with 65536 bytes"))
        local late = srv:request { path = "/late" }.body
        assert.truthy(late:find("^false [^ ]*app%.lua:%d+: k%.shared_dict: dictionaries are declared while the script loads"), late)
        assert.truthy(srv:request { path = "/badvalue" }.body:find("strings, numbers, booleans or nil"))
    end)
end)
