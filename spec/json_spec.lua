-- k.json: our own codec (lua/kh_lua_json.c). Empty and marked arrays, '/' not escaped, errors
-- that name the path of the offending value, req:json()'s depth limit, and returned tables /
-- k.fail tables through the same encoder; over every protocol.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local j = k.json
k.get("/empty", function() return { items = j.array({}) } end)
k.get("/slash", function() return { url = "/a/b", s = "q\"\\\n\1é" } end)
k.get("/encode", function() return j.encode({ 1, "x/y", true, false, j.null, 0.5, -3, 2^53 }) end)
k.get("/plain-empty", function() return j.encode({ a = {} }) end)
k.get("/encode-error", function()
    local ok, e = pcall(j.encode, { items = { 1, 2, { name = function() end } } })
    return e
end)
k.get("/returned-bad", function() return { items = { 1, { f = print } } } end)
k.get("/fail-table", function() k.fail(422, { errors = j.array({}), path = "/x" }) end)
k.post("/echo", function(req) return req:json() end)
k.post("/echo-deep", function(req) return req:json(500) end)
k.post("/decode", function(req)
    local v, err = j.decode(req:body())
    if v == nil then return 400, "nil: " .. err end
    return j.encode(v)
end)
k.get("/null", function() return tostring(j.decode("null") == j.null) .. " " .. tostring(j.is_array(j.decode("[]"))) end)
k.get("/misuse", function() local ok, e = pcall(j.array, 5); return e end)
]]

describe("k.json", function()
    local srv
    setup(function()
        srv = server.start { app = APP, expect_errors = { "cannot be sent as JSON" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function get(path) return srv:request { proto = proto, path = path } end
            local function post(path, body)
                return srv:request { proto = proto, method = "POST", path = path, body = body,
                    headers = { ["Content-Type"] = "application/json" } }
            end

            it("sends a marked empty table as [] (a returned table uses k.json)", function()
                local r = get("/empty")
                assert.are.equal(200, r.status)
                assert.are.equal('{"items":[]}', r.body)
                assert.are.equal("application/json", r.headers["content-type"])
            end)

            it("does not escape '/', escapes quotes, backslashes and control bytes", function()
                local r = get("/slash")
                assert.truthy(r.body:find('"url":"/a/b"', 1, true), r.body)
                assert.truthy(r.body:find('"s":"q\\"\\\\\\n\\u0001é"', 1, true), r.body)
            end)

            it("encodes scalars, null and integers as JSON has them", function()
                assert.are.equal('[1,"x/y",true,false,null,0.5,-3,9007199254740992]', get("/encode").body)
                assert.are.equal('{"a":{}}', get("/plain-empty").body)
            end)

            it("names the path of a value it cannot encode, at the caller's line", function()
                local r = get("/encode-error")
                assert.truthy(r.body:find("app.lua:8: k.json.encode: a function cannot be sent as JSON, at $.items[3].name", 1, true), r.body)
                r = get("/returned-bad")
                assert.are.equal(500, r.status)
                assert.truthy(server.wait_until(5, function()
                    return srv:log():find("a table that cannot be sent as JSON: a function cannot be sent as JSON, at $.items[2].f", 1, true)
                end), srv:log())
            end)

            it("sends k.fail's table with the same encoder", function()
                local r = get("/fail-table")
                assert.are.equal(422, r.status)
                assert.truthy(r.body:find('"errors":[]', 1, true), r.body)
                assert.truthy(r.body:find('"path":"/x"', 1, true), r.body)
            end)

            it("round-trips req:json(), [] included", function()
                local r = post("/echo", '{"a":[],"b":[1,{"c":null}],"s":"\\u00e9\\ud83d\\ude00\\/x"}')
                assert.are.equal(200, r.status)
                assert.truthy(r.body:find('"a":[]', 1, true), r.body)
                assert.truthy(r.body:find('"b":[1,{"c":null}]', 1, true), r.body)
                assert.truthy(r.body:find('"s":"é😀/x"', 1, true), r.body)
            end)

            it("answers 400 naming the path of bad JSON", function()
                local r = post("/echo", '{"items":[1,2,{"name":tru}]}')
                assert.are.equal(400, r.status)
                assert.are.equal("invalid JSON: expected a value at byte 23 ('t'), at $.items[3].name\n", r.body)
                r = post("/echo", '[1,2,]')
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("at $[3]", 1, true), r.body)
                r = post("/echo", '')
                assert.are.equal(400, r.status)
                r = post("/echo", '{"a":1} x')
                assert.truthy(r.body:find("more data after the value", 1, true), r.body)
                r = post("/echo", '"\\ud800"')
                assert.truthy(r.body:find("surrogate", 1, true), r.body)
                r = post("/echo", '"a\tb"')
                assert.truthy(r.body:find("control byte", 1, true), r.body)
            end)

            it("limits req:json()'s depth to 100 unless told otherwise", function()
                local ok = string.rep("[", 100) .. string.rep("]", 100)
                local deep = string.rep("[", 101) .. string.rep("]", 101)
                assert.are.equal(200, post("/echo", ok).status)
                local r = post("/echo", deep)
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("nesting too deep", 1, true), r.body)
                assert.are.equal(200, post("/echo-deep", deep).status)
                local huge = string.rep('{"a":', 3000) .. "1" .. string.rep("}", 3000)
                r = post("/echo", huge)
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("at $.a.a.a.a", 1, true), r.body)
                r = post("/echo-deep", huge) -- a long path keeps its innermost part
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("at $[...].a.a", 1, true), r.body)
                assert.truthy(#r.body < 500, #r.body)
            end)

            it("k.json.decode returns nil, message for bad JSON; null and arrays keep their kind", function()
                local r = post("/decode", '{"a":[1,')
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("nil: ", 1, true), r.body)
                assert.truthy(r.body:find("at $.a[2]", 1, true), r.body)
                assert.are.equal("true true", get("/null").body)
                assert.are.equal('[1.25e+300,-0.001,12]', post("/decode", ' [ 1.25e300 , -1e-3, 12 ] ').body)
            end)

            it("refuses a misuse at the caller's line", function()
                assert.truthy(get("/misuse").body:find("app.lua:21: k.json.array(t): t must be a table, got a number", 1, true))
            end)
        end)
    end)
end)
