-- req.headers (issue 15): built through the FFI (kh_lua_req_headers, lua/kh_lua_core.c) so that
-- the handler stays on its JIT trace; the table must be the one core.headers (the lua_CFunction
-- it replaced, still the path of a held WebSocket's req) makes, on every protocol: every field,
-- lower-case names, any-case lookup, repeated fields joined with ", " (Cookie with "; "), a plain
-- table the app may iterate with pairs, change and keep; empty once the request is over.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
local core = require "khamsin.core"
local request = require "khamsin.request"
local ffi = require "ffi"
local kept, kept_read

-- the FFI table against core.headers' for the same request: "" when equal, else the difference
local function diff(h, req)
    local old = core.headers(rawget(req, "_s"), rawget(req, "_g"))
    local out = {}
    for name, v in pairs(old) do
        if rawget(h, name) ~= v then out[#out + 1] = name .. ": " .. tostring(rawget(h, name)) .. " ~= " .. v end
    end
    for name in pairs(h) do
        if old[name] == nil then out[#out + 1] = name .. ": only in req.headers" end
    end
    table.sort(out)
    return table.concat(out, "; ")
end

local function sorted(h)
    local list = {}
    for name, v in pairs(h) do list[#list + 1] = name .. "=" .. v end
    table.sort(list)
    return list
end

k.get("/h", function(req)
    local h = req.headers
    local t = {
        diff = diff(h, req),
        all = sorted(h),
        mixed = h["X-Mixed-Case"], upper = h["X-MIXED-CASE"], lower = h["x-mixed-case"],
        raw_lower_only = rawget(h, "X-Mixed-Case") == nil and rawget(h, "x-mixed-case") ~= nil,
        multi = h["x-multi"], cookie = h.Cookie, empty = h["x-empty"],
        missing = h["x-missing"] == nil, number_key = h[1] == nil,
        same = req.headers == h,
        ffi = request.headers_ffi,
        fast = pcall(function() return ffi.C.kh_lua_respond_fast end),
    }
    h["x-added"] = "mine"
    t.added = req.headers["X-Added"]
    return t
end)

-- more fields than the unrolled part (24) and than the first FFI array (32)
k.get("/many", function(req)
    local h, n, bad = req.headers, 0, {}
    for i = 1, 40 do
        if h["x-h-" .. i] ~= "v" .. i then bad[#bad + 1] = i end
    end
    for _ in pairs(h) do n = n + 1 end
    return { n = n, bad = bad, diff = diff(h, req), via_upper = h["X-H-40"] }
end)

-- read first after a wait, or before and after one
k.get("/after-wait", function(req)
    k.sleep(0)
    return { diff = diff(req.headers, req), x = req.headers["X-After"] }
end)
k.get("/across-wait", function(req)
    local h = req.headers
    k.sleep(0.01)
    return { x = h["x-after"], same = req.headers == h, diff = diff(h, req) }
end)

-- a req kept past its request: a table read during the request stays; one read after is empty
k.get("/keep", function(req)
    kept, kept_read = req, nil
    return "kept"
end)
k.get("/keep-read", function(req)
    kept_read = req
    return req.headers["x-keep"] or "none"
end)
k.get("/stale", function()
    local n = 0
    for _ in pairs(kept.headers) do n = n + 1 end
    return { n = n, read = kept_read and kept_read.headers["x-keep"] or false }
end)
]]

local function json(r)
    assert.are.equal(200, r.status, r.body)
    local ok, t = pcall(cjson.decode, r.body)
    assert(ok, "body is not JSON: " .. tostring(r.body))
    return t
end

describe("req.headers", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(t)
                t.proto = proto
                return json(srv:request(t))
            end

            it("is core.headers' table, with any-case lookup, joins and pairs", function()
                local t = req { path = "/h", headers = {
                    { "X-Mixed-Case", "MiXeD" }, { "X-Multi", "a" }, { "X-Multi", "b" },
                    { "X-Multi", "c" }, { "Cookie", "a=1" }, { "Cookie", "b=2" },
                    { "X-Empty", "" }, { "User-Agent", "spec/1" },
                } }
                assert.are.equal("", t.diff)
                assert.is_true(t.ffi)
                assert.is_true(t.fast) -- both FFI declarations loaded (one cdef must not undo the other)
                assert.are.equal("MiXeD", t.mixed)
                assert.are.equal("MiXeD", t.upper)
                assert.are.equal("MiXeD", t.lower)
                assert.is_true(t.raw_lower_only)
                assert.are.equal("a, b, c", t.multi)
                assert.are.equal("a=1; b=2", t.cookie)
                assert.are.equal("", t.empty)
                assert.is_true(t.missing)
                assert.is_true(t.number_key)
                assert.is_true(t.same)
                assert.are.equal("mine", t.added)
                local seen = {}
                for _, line in ipairs(t.all) do seen[line:match("^[^=]*")] = line end
                assert.are.equal("x-multi=a, b, c", seen["x-multi"])
                assert.are.equal("user-agent=spec/1", seen["user-agent"])
                assert.are.equal("x-empty=", seen["x-empty"])
                for name in pairs(seen) do assert.are.equal(name:lower(), name) end
            end)

            it("holds more fields than the unrolled part and the first array", function()
                local hs = {}
                for i = 1, 40 do hs[#hs + 1] = { "X-H-" .. i, "v" .. i } end
                local t = req { path = "/many", headers = hs }
                assert.are.same({}, t.bad)
                assert.are.equal("", t.diff)
                assert.are.equal("v40", t.via_upper)
                assert.is_true(t.n >= 40)
            end)

            it("reads alike after the handler waited", function()
                local t = req { path = "/after-wait", headers = { { "X-After", "1" } } }
                assert.are.equal("", t.diff)
                assert.are.equal("1", t.x)
                t = req { path = "/across-wait", headers = { { "X-After", "2" } } }
                assert.are.equal("", t.diff)
                assert.are.equal("2", t.x)
                assert.is_true(t.same)
            end)
        end)
    end)

    it("is empty on a req kept past its request, unless read during it", function()
        assert.are.equal("kept", srv:request { path = "/keep" }.body)
        assert.are.equal("k", srv:request { path = "/keep-read", headers = { { "X-Keep", "k" } } }.body)
        local t = json(srv:request { path = "/stale" })
        assert.are.equal(0, t.n)
        assert.are.equal("k", t.read)
    end)
end)
