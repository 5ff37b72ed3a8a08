-- Routing: verbs, :params, *splat, 404/405, HEAD via GET, k.route, k.any, query decoding
-- and the request fields a handler sees.
--
-- Decisions (the contract leaves them open):
-- * req.args: a key given once is a string; a repeated key is a Lua array of its values in
--   order (?b=1&b=2 -> {"1", "2"}); values are percent-decoded, and "+" decodes to a space
--   (application/x-www-form-urlencoded, as WHATWG URLSearchParams and ngx.req.get_uri_args).
-- * req.query is the raw query string without "?", nil when the target has no "?".
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"

k.get("/", function() return "root" end)
k.get("/hello", function() return "hello" end)
k.get("/len", function() return "12345" end)

k.post("/things", function() return 201, "created" end)
k.get("/things", function() return "list" end)
k.options("/things", function() return "options" end)
k.put("/things/:id", function(req) return "put " .. req.params.id end)
k.patch("/things/:id", function(req) return "patch " .. req.params.id end)
k.delete("/things/:id", function(req) return "delete " .. req.params.id end)

k.get("/users/:id/posts/:post", function(req)
    return req.params.id .. "|" .. req.params.post
end)
k.get("/files/*rest", function(req) return "files:" .. req.params.rest end)

k.route("GET", "/custom", function(req) return "custom " .. req.method end)
k.route("POST", "/custom", function(req) return "custom " .. req.method end)
k.any("/any", function(req) return "any " .. req.method end)

k.get("/query", function(req)
    return { query = req.query, args = req.args }
end)
k.get("/arg", function(req)
    local v = req.args[req.args.name or "v"]
    if type(v) == "table" then return "table:" .. table.concat(v, ",") end
    return type(v) .. ":" .. tostring(v)
end)

k.get("/req", function(req)
    return {
        method = req.method,
        path = req.path,
        query = req.query,
        version = req.version,
        remote_addr = req.remote_addr,
        ua_mixed = req.headers["User-Agent"],
        ua_lower = req.headers["user-agent"],
        ua_upper = req.headers["USER-AGENT"],
        multi = req.headers["x-multi"],
        missing = req.headers["x-missing"] == nil,
    }
end)
]]

local function json(r)
    local ok, t = pcall(cjson.decode, r.body)
    assert(ok, "body is not JSON: " .. tostring(r.body))
    return t
end

describe("routing", function()
    local srv
    setup(function()
        srv = server.start { app = APP }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(t)
                t.proto = proto
                return srv:request(t)
            end

            it("routes GET to a static path", function()
                local r = req { path = "/hello" }
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                r = req { path = "/" }
                assert.are.equal(200, r.status)
                assert.are.equal("root", r.body)
            end)

            it("routes every verb helper", function()
                local r = req { method = "POST", path = "/things", body = "" }
                assert.are.equal(201, r.status)
                assert.are.equal("created", r.body)
                r = req { path = "/things" }
                assert.are.equal("list", r.body)
                r = req { method = "PUT", path = "/things/7", body = "x" }
                assert.are.equal(200, r.status)
                assert.are.equal("put 7", r.body)
                r = req { method = "PATCH", path = "/things/8", body = "x" }
                assert.are.equal("patch 8", r.body)
                r = req { method = "DELETE", path = "/things/9" }
                assert.are.equal("delete 9", r.body)
                r = req { method = "OPTIONS", path = "/things" }
                assert.are.equal(200, r.status)
                assert.are.equal("options", r.body)
            end)

            it("binds several :params", function()
                local r = req { path = "/users/42/posts/hello-world" }
                assert.are.equal(200, r.status)
                assert.are.equal("42|hello-world", r.body)
            end)

            it("does not match a :param across a slash", function()
                local r = req { path = "/users/42/extra/posts/1" }
                assert.are.equal(404, r.status)
            end)

            it("binds a trailing *splat to the rest of the path, slashes included", function()
                local r = req { path = "/files/a/b/c.txt" }
                assert.are.equal(200, r.status)
                assert.are.equal("files:a/b/c.txt", r.body)
                r = req { path = "/files/one" }
                assert.are.equal("files:one", r.body)
            end)

            it("answers 404 for an unknown path", function()
                local r = req { path = "/no/such/path" }
                assert.are.equal(404, r.status)
                assert.are.equal(tostring(#r.body), r.headers["content-length"])
                assert.truthy(r.headers.date)
                assert.are.equal("khamsin", r.headers.server)
            end)

            it("answers 405 with Allow for a known path and another method", function()
                local r = req { method = "DELETE", path = "/hello" }
                assert.are.equal(405, r.status)
                local allow = r.headers.allow
                assert.truthy(allow, "405 without an Allow header")
                assert.truthy(allow:find("GET", 1, true), "Allow: " .. allow)
                assert.falsy(allow:find("DELETE", 1, true), "Allow: " .. allow)

                r = req { method = "POST", path = "/things/1", body = "" }
                assert.are.equal(405, r.status)
                allow = r.headers.allow or ""
                for _, m in ipairs { "PUT", "PATCH", "DELETE" } do
                    assert.truthy(allow:find(m, 1, true), m .. " missing from Allow: " .. allow)
                end
            end)

            it("answers HEAD through the GET route with no body and the GET Content-Length", function()
                local r = req { method = "HEAD", path = "/len" }
                assert.are.equal(200, r.status)
                assert.are.equal("5", r.headers["content-length"])
                assert.are.equal("", r.body)
            end)

            it("registers routes with k.route", function()
                assert.are.equal("custom GET", req { path = "/custom" }.body)
                assert.are.equal("custom POST", req { method = "POST", path = "/custom", body = "" }.body)
            end)

            it("k.any answers every method", function()
                for _, m in ipairs { "GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS" } do
                    local r = req { method = m, path = "/any", body = (m ~= "GET" and m ~= "OPTIONS") and "" or nil }
                    assert.are.equal(200, r.status, m)
                    assert.are.equal("any " .. m, r.body)
                end
            end)

            it("decodes the query: percent-escapes, and a repeated key becomes an array", function()
                local r = req { path = "/query?a=1&b=x%20y&b=2" }
                assert.are.equal(200, r.status)
                local t = json(r)
                assert.are.equal("a=1&b=x%20y&b=2", t.query)
                assert.are.equal("1", t.args.a)
                assert.are.same({ "x y", "2" }, t.args.b)
            end)

            it("keeps a single value as a string and an absent key as nil", function()
                assert.are.equal("string:1", req { path = "/arg?v=1" }.body)
                assert.are.equal("nil:nil", req { path = "/arg?w=1" }.body)
                assert.are.equal("table:1,2,3", req { path = "/arg?v=1&v=2&v=3" }.body)
            end)

            it("decodes '+' in the query as a space (form encoding)", function()
                assert.are.equal("string:a b", req { path = "/arg?v=a+b" }.body)
                assert.are.equal("string:a+b", req { path = "/arg?v=a%2Bb" }.body)
            end)

            it("gives req.query nil and req.args empty without a query", function()
                local t = json(req { path = "/query" })
                assert.is_nil(t.query)
                assert.are.same({}, t.args)
            end)

            it("fills the request fields", function()
                local r = req {
                    path = "/req?x=1",
                    headers = { { "User-Agent", "spec-agent/1" }, { "X-Multi", "a" }, { "X-Multi", "b" } },
                }
                assert.are.equal(200, r.status)
                assert.truthy((r.headers["content-type"] or ""):match("^application/json"))
                local t = json(r)
                assert.are.equal("GET", t.method)
                assert.are.equal("/req", t.path)
                assert.are.equal("x=1", t.query)
                assert.are.equal(proto:match("^h2") and "2.0" or proto == "h3" and "3.0" or "1.1", t.version) -- h2c, h2
                assert.are.equal("127.0.0.1", t.remote_addr)
                assert.are.equal("spec-agent/1", t.ua_mixed)
                assert.are.equal("spec-agent/1", t.ua_lower)
                assert.are.equal("spec-agent/1", t.ua_upper)
                assert.are.equal("a, b", t.multi)
                assert.is_true(t.missing)
            end)
        end)
    end)

    it("reports version 1.0 for an HTTP/1.0 request", function()
        local r = srv:raw_request { path = "/req", version = "1.0" }
        assert.are.equal(200, r.status)
        assert.are.equal("1.0", json(r).version)
    end)

    it("sends no body bytes for HEAD (the next pipelined answer follows the head)", function()
        local data = srv:raw("HEAD /len HTTP/1.1\r\nHost: x\r\n\r\n"
            .. "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        local list = server.parse_responses(data, { head = { true } })
        assert.are.equal(2, #list, data)
        assert.are.equal(200, list[1].status)
        assert.are.equal("5", list[1].headers["content-length"])
        assert.are.equal("HTTP/1.1 200", list[2].status_line:sub(1, 12))
        assert.are.equal("hello", list[2].body)
    end)
end)

describe("k.route with an extension method", function()
    -- RFC 9110 §9.1: methods are extensible tokens; a separate server so that a router that
    -- refuses the registration fails only this block.
    local srv
    setup(function()
        srv = server.start { app = [[
local k = require "khamsin"
k.route("PURGE", "/cache", function(req) return "purged " .. req.method end)
]] }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    server.each_protocol(function(proto)
        it("answers PURGE over " .. proto, function()
            local r = srv:request { proto = proto, method = "PURGE", path = "/cache" }
            assert.are.equal(200, r.status)
            assert.are.equal("purged PURGE", r.body)
            r = srv:request { proto = proto, path = "/cache" }
            assert.are.equal(405, r.status)
            assert.truthy((r.headers.allow or ""):find("PURGE", 1, true))
        end)
    end)
end)
