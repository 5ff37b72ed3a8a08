-- Redirects and conditional replies: res:redirect (Location, 302 by default, relative allowed,
-- CR/LF refused); res:etag / res:last_modified, and the engine's 304 for GET/HEAD (RFC 9110
-- §13.2.2: If-None-Match wins over If-Modified-Since, weak comparison; the 304 keeps ETag,
-- Last-Modified, Cache-Control, Vary and drops the body and Content-Type); 412 for unsafe
-- methods whose If-Match / If-None-Match / If-Unmodified-Since fail, before the handler acts.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local LM = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT
local version = 1
k.get("/go", function(req, res) return res:redirect("/login?next=%2Fgo") end)
k.get("/go301", function(req, res) return res:redirect("https://example.com/x", 301) end)
k.get("/bad", function(req, res)
    local r = {}
    for _, u in ipairs { "/a\r\nX-Evil: 1", "/a\nb", "", "/a b" } do
        r[#r + 1] = tostring(select(2, pcall(res.redirect, res, u)))
    end
    r[#r + 1] = tostring(select(2, pcall(res.redirect, res, "/x", 200)))
    r[#r + 1] = tostring(select(2, pcall(res.etag, res, 'a"b')))
    r[#r + 1] = tostring(select(2, pcall(res.last_modified, res, "yesterday")))
    return table.concat(r, "@@")
end)
k.get("/doc", function(req, res)
    res:etag("v" .. version)
    res:last_modified(LM)
    res.headers["Cache-Control"] = "max-age=60"
    res.headers["Vary"] = "Accept-Language"
    res.headers["X-Other"] = "dropped on 304"
    return "the document, version " .. version
end)
k.get("/weak", function(req, res)
    res:etag("w1", true)
    return { ok = true }
end)
k.get("/created", function(req, res) res:etag("c1"); return 201, "made" end)
k.put("/doc", function(req, res)
    res:etag("v" .. version)       -- raises 412 before anything changes
    res:last_modified(LM)
    version = version + 1
    return "now v" .. version
end)
k.get("/version", function() return tostring(version) end)
]]

describe("redirects and conditional replies", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    local LMS = "Sun, 06 Nov 1994 08:49:37 GMT"

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(path, o)
                o = o or {}
                o.proto, o.path = proto, path
                return srv:request(o)
            end

            it("redirects with Location, 302 by default, relative allowed", function()
                local r = req("/go")
                assert.are.equal(302, r.status)
                assert.are.equal("/login?next=%2Fgo", r.headers["location"])
                assert.are.equal("", r.body)
                r = req("/go301")
                assert.are.equal(301, r.status)
                assert.are.equal("https://example.com/x", r.headers["location"])
            end)

            it("refuses CR/LF and bad statuses at the app's line", function()
                local body = req("/bad").body
                local n = 0
                for line in (body .. "@@"):gmatch("(.-)@@") do
                    n = n + 1
                    assert.truthy(line:find("app%.lua:%d+: res:"), line)
                end
                assert.are.equal(7, n, body)
                assert.truthy(body:find("status must be 301, 302", 1, true))
            end)

            it("sends ETag and Last-Modified, and 200 without conditions", function()
                local r = req("/doc")
                assert.are.equal(200, r.status)
                assert.are.equal('"v1"', r.headers["etag"])
                assert.are.equal(LMS, r.headers["last-modified"])
            end)

            it("answers 304 for a matching If-None-Match (weak comparison, lists, *)", function()
                for _, inm in ipairs { '"v1"', 'W/"v1"', '"x", "v1"', "*" } do
                    local r = req("/doc", { headers = { ["If-None-Match"] = inm } })
                    assert.are.equal(304, r.status, inm)
                    assert.are.equal("", r.body)
                    assert.are.equal('"v1"', r.headers["etag"])
                    assert.are.equal(LMS, r.headers["last-modified"])
                    assert.are.equal("max-age=60", r.headers["cache-control"])
                    assert.are.equal("Accept-Language", r.headers["vary"])
                    assert.is_nil(r.headers["x-other"])
                    assert.is_nil(r.headers["content-type"])
                    assert.is_nil(r.headers["content-length"])
                end
                local r = req("/weak", { headers = { ["If-None-Match"] = '"w1"' } })
                assert.are.equal(304, r.status)
                assert.are.equal('W/"w1"', r.headers["etag"])
            end)

            it("answers 304 to HEAD too", function()
                local r = req("/doc", { method = "HEAD", headers = { ["If-None-Match"] = '"v1"' } })
                assert.are.equal(304, r.status)
            end)

            it("answers 200 when If-None-Match does not match, even if If-Modified-Since would", function()
                local r = req("/doc", { headers = { ["If-None-Match"] = '"v0"', ["If-Modified-Since"] = LMS } })
                assert.are.equal(200, r.status)
                assert.are.equal("the document, version 1", r.body)
            end)

            it("answers 304 for If-Modified-Since not older than Last-Modified", function()
                assert.are.equal(304, req("/doc", { headers = { ["If-Modified-Since"] = LMS } }).status)
                assert.are.equal(304, req("/doc", { headers = { ["If-Modified-Since"] = "Sunday, 06-Nov-94 08:49:37 GMT" } }).status)
                assert.are.equal(304, req("/doc", { headers = { ["If-Modified-Since"] = "Mon, 07 Nov 1994 00:00:00 GMT" } }).status)
                assert.are.equal(200, req("/doc", { headers = { ["If-Modified-Since"] = "Sat, 05 Nov 1994 08:49:37 GMT" } }).status)
                assert.are.equal(200, req("/doc", { headers = { ["If-Modified-Since"] = "not a date" } }).status)
            end)

            it("leaves statuses other than 200 alone", function()
                local r = req("/created", { headers = { ["If-None-Match"] = '"c1"' } })
                assert.are.equal(201, r.status)
                assert.are.equal("made", r.body)
            end)
        end)
    end)

    it("answers 412 to an unsafe method whose preconditions fail, before the handler acts", function()
        local r = srv:request { path = "/doc", method = "PUT", body = "x", headers = { ["If-Match"] = '"v0"' } }
        assert.are.equal(412, r.status)
        r = srv:request { path = "/doc", method = "PUT", body = "x", headers = { ["If-Match"] = 'W/"v1"' } }
        assert.are.equal(412, r.status) -- If-Match compares strongly
        r = srv:request { path = "/doc", method = "PUT", body = "x", headers = { ["If-None-Match"] = "*" } }
        assert.are.equal(412, r.status)
        r = srv:request { path = "/doc", method = "PUT", body = "x",
            headers = { ["If-Unmodified-Since"] = "Sat, 05 Nov 1994 08:49:37 GMT" } }
        assert.are.equal(412, r.status)
        assert.are.equal("1", srv:request { path = "/version" }.body)
        r = srv:request { path = "/doc", method = "PUT", body = "x", headers = { ["If-Match"] = '"v1"' } }
        assert.are.equal(200, r.status)
        assert.are.equal("now v2", r.body)
        r = srv:request { path = "/doc", method = "PUT", body = "x", headers = { ["If-Unmodified-Since"] = LMS } }
        assert.are.equal(200, r.status)
        assert.are.equal("3", srv:request { path = "/version" }.body)
    end)
end)
