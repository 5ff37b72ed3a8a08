-- k.cors: preflights answered 204 by the middleware on any path (never by a handler, never a
-- 405 for an unknown path), the allowed origin echoed with Vary: Origin, never "*" with
-- credentials, CORS headers on the engine's own 404/405 and on k.fail / 500 pages, origins as a
-- list, a function or "*", over h1 and h2.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.use("/api", k.cors {
    origins = { "https://app.example", "http://localhost:3000" },
    methods = { "GET", "POST", "PUT" },
    credentials = true,
    max_age = 600,
    expose = "X-Total",
})
k.use("/fn", k.cors {
    origins = function(origin, req) return origin:match("%.trusted%.example$") ~= nil end,
    headers = { "Content-Type", "X-Token" },
})
k.use("/open", k.cors { origins = "*" })
k.get("/api/items", function() return { "a" } end)
k.options("/api/items", function() return 200, "the OPTIONS handler ran" end)
k.put("/api/items", function() return "put" end)
k.get("/api/fail", function() k.fail(403, "no") end)
k.get("/api/boom", function() error("cors boom") end)
k.get("/fn/x", function() return "fn" end)
k.get("/open/x", function() return "open" end)
]]

describe("k.cors", function()
    local srv
    setup(function() srv = server.start { app = APP, expect_errors = { "cors boom" } } end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(path, o)
                o = o or {}
                o.proto, o.path = proto, path
                return srv:request(o)
            end
            local function preflight(path, origin, extra)
                local h = { Origin = origin, ["Access-Control-Request-Method"] = "PUT" }
                for k, v in pairs(extra or {}) do h[k] = v end
                return req(path, { method = "OPTIONS", headers = h })
            end

            it("answers a preflight with 204 and never runs the OPTIONS handler", function()
                local r = preflight("/api/items", "https://app.example",
                    { ["Access-Control-Request-Headers"] = "content-type" })
                assert.are.equal(204, r.status)
                assert.are.equal("", r.body)
                assert.are.equal("https://app.example", r.headers["access-control-allow-origin"])
                assert.are.equal("true", r.headers["access-control-allow-credentials"])
                assert.are.equal("GET, POST, PUT", r.headers["access-control-allow-methods"])
                assert.are.equal("content-type", r.headers["access-control-allow-headers"])
                assert.are.equal("600", r.headers["access-control-max-age"])
                assert.truthy(r.headers["vary"]:find("Origin", 1, true))
                -- a plain OPTIONS (no Access-Control-Request-Method) reaches the handler
                r = req("/api/items", { method = "OPTIONS", headers = { Origin = "https://app.example" } })
                assert.are.equal("the OPTIONS handler ran", r.body)
            end)

            it("answers a preflight for an unknown path; the request itself stays 404", function()
                local r = preflight("/api/nothing", "https://app.example")
                assert.are.equal(204, r.status)
                r = req("/api/nothing", { headers = { Origin = "https://app.example" } })
                assert.are.equal(404, r.status)
                assert.are.equal("https://app.example", r.headers["access-control-allow-origin"])
                r = req("/api/items", { method = "DELETE", headers = { Origin = "https://app.example" } })
                assert.are.equal(405, r.status)
                assert.are.equal("GET, HEAD, PUT, OPTIONS", r.headers["allow"])
                assert.are.equal("https://app.example", r.headers["access-control-allow-origin"])
            end)

            it("gives no CORS headers to an origin not allowed", function()
                local r = preflight("/api/items", "https://evil.example")
                assert.are.equal(204, r.status)
                assert.is_nil(r.headers["access-control-allow-origin"])
                assert.is_nil(r.headers["access-control-allow-methods"])
                r = req("/api/items", { headers = { Origin = "https://evil.example" } })
                assert.are.equal(200, r.status)
                assert.is_nil(r.headers["access-control-allow-origin"])
                assert.truthy(r.headers["vary"]:find("Origin", 1, true))
            end)

            it("echoes the origin (never *) with credentials, on success and error pages", function()
                for _, path in ipairs { "/api/items", "/api/fail", "/api/boom" } do
                    local r = req(path, { headers = { Origin = "http://localhost:3000" } })
                    assert.are.equal("http://localhost:3000", r.headers["access-control-allow-origin"], path)
                    assert.are.equal("true", r.headers["access-control-allow-credentials"], path)
                    assert.are.equal("X-Total", r.headers["access-control-expose-headers"], path)
                end
                assert.are.equal(403, req("/api/fail", { headers = { Origin = "http://localhost:3000" } }).status)
            end)

            it("takes a function for origins and a fixed header list", function()
                local r = preflight("/fn/x", "https://a.trusted.example",
                    { ["Access-Control-Request-Headers"] = "x-other" })
                assert.are.equal(204, r.status)
                assert.are.equal("https://a.trusted.example", r.headers["access-control-allow-origin"])
                assert.are.equal("Content-Type, X-Token", r.headers["access-control-allow-headers"])
                assert.is_nil(r.headers["access-control-allow-credentials"])
                r = req("/fn/x", { headers = { Origin = "https://trusted.example.evil" } })
                assert.is_nil(r.headers["access-control-allow-origin"])
            end)

            it("answers * without Vary for origins = '*'", function()
                local r = req("/open/x", { headers = { Origin = "https://any.example" } })
                assert.are.equal("open", r.body)
                assert.are.equal("*", r.headers["access-control-allow-origin"])
                assert.is_nil(r.headers["vary"])
                assert.is_nil(r.headers["access-control-allow-credentials"])
            end)

            it("leaves requests outside its prefix alone", function()
                local r = preflight("/elsewhere", "https://app.example")
                assert.are.equal(404, r.status)
                assert.is_nil(r.headers["access-control-allow-origin"])
            end)
        end)
    end)
end)
