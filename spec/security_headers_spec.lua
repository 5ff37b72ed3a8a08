-- The security fields the engine adds to responses over TLS (kh_stream_send_head):
-- Strict-Transport-Security (RFC 6797; limit hsts_max_age) and X-Content-Type-Options: nosniff
-- (limit tls_nosniff), each only when the handler did not set that field itself. Over cleartext
-- nothing is added: RFC 6797 §7.2 has a UA ignore HSTS there, and cleartext responses keep the
-- exact bytes they had before these fields existed.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "plain" end)
k.get("/own", function(req, res)
    res.headers["Strict-Transport-Security"] = "max-age=600; includeSubDomains"
    res.headers["x-content-type-options"] = "NOSNIFF"
    return "own"
end)
k.get("/own-hsts", function()
    return 200, "own hsts", { ["strict-transport-security"] = "max-age=63072000; preload" }
end)
k.get("/204", function() return 204 end)
]]

local TLS = { ["h1+tls"] = true, h2 = true, h3 = true } -- HTTP/3 is always over TLS (QUIC)
local DEFAULT_HSTS = "max-age=31536000"

-- Every value of a field (lower-case name) in a response, in order.
local function values(r, name)
    local out = {}
    for _, h in ipairs(r.header_list) do
        if h[1] == name then out[#out + 1] = h[2] end
    end
    return out
end

local function assert_once(r, name, want, proto)
    local v = values(r, name)
    assert.are.same({ want }, v, name .. " over " .. proto)
end

local function assert_absent(r, name, proto)
    assert.are.same({}, values(r, name), name .. " over " .. proto)
end

describe("security headers", function()
    describe("by default", function()
        local srv
        setup(function() srv = server.start { app = APP } end)
        teardown(function() if srv then srv:stop() end end)

        server.each_protocol(function(proto)
            local tls = TLS[proto]
            it((tls and "are added" or "are not added") .. " over " .. proto, function()
                -- a handler's reply, a 204, and one the engine gives without the app (404)
                for _, path in ipairs { "/", "/204", "/no-such-route" } do
                    local r = srv:request { proto = proto, path = path }
                    assert.is_nil(r.err, r.err)
                    if tls then
                        assert_once(r, "strict-transport-security", DEFAULT_HSTS, proto .. " " .. path)
                        assert_once(r, "x-content-type-options", "nosniff", proto .. " " .. path)
                    else
                        assert_absent(r, "strict-transport-security", proto .. " " .. path)
                        assert_absent(r, "x-content-type-options", proto .. " " .. path)
                    end
                end
            end)

            it("on HEAD too over " .. proto, function()
                local r = srv:request { proto = proto, method = "HEAD", path = "/" }
                assert.are.equal(200, r.status)
                if tls then
                    assert_once(r, "strict-transport-security", DEFAULT_HSTS, proto)
                else
                    assert_absent(r, "strict-transport-security", proto)
                end
            end)

            it("leave the handler's own fields alone, never doubled, over " .. proto, function()
                local r = srv:request { proto = proto, path = "/own" }
                assert.are.equal("own", r.body)
                assert_once(r, "strict-transport-security", "max-age=600; includeSubDomains", proto)
                assert_once(r, "x-content-type-options", "NOSNIFF", proto)
                -- one set by the handler, the other still added (over TLS)
                r = srv:request { proto = proto, path = "/own-hsts" }
                assert_once(r, "strict-transport-security", "max-age=63072000; preload", proto)
                if tls then
                    assert_once(r, "x-content-type-options", "nosniff", proto)
                else
                    assert_absent(r, "x-content-type-options", proto)
                end
            end)
        end)

        it("leave a cleartext HTTP/1.1 response as before (X-Request-Id: a client's own, echoed)", function()
            local r = assert(srv:raw_request { path = "/" })
            local names = {}
            for _, h in ipairs(r.header_list) do names[#names + 1] = h[1] end
            assert.are.same({ "server", "date", "content-type", "content-length", "connection" }, names)
            r = assert(srv:raw_request { path = "/", headers = { ["X-Request-Id"] = "sec" } })
            names = {}
            for _, h in ipairs(r.header_list) do names[#names + 1] = h[1] end
            assert.are.same({ "server", "date", "content-type", "x-request-id", "content-length", "connection" }, names)
        end)
    end)

    describe("with --hsts-max-age 0 --tls-nosniff 0", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = { "--hsts-max-age", "0", "--tls-nosniff", "0" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        for _, proto in ipairs { "h1+tls", "h2" } do
            it("adds neither over " .. proto, function()
                local r = srv:request { proto = proto, path = "/" }
                assert.are.equal(200, r.status)
                assert_absent(r, "strict-transport-security", proto)
                assert_absent(r, "x-content-type-options", proto)
                -- a handler can still send its own
                r = srv:request { proto = proto, path = "/own" }
                assert_once(r, "strict-transport-security", "max-age=600; includeSubDomains", proto)
            end)
        end
    end)

    describe("with --limit hsts_max_age=15552000", function()
        local srv
        setup(function()
            srv = server.start { app = APP, tls = true, args = { "--limit", "hsts_max_age=15552000" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("sends that max-age", function()
            local r = srv:request { proto = "h2", path = "/" }
            assert_once(r, "strict-transport-security", "max-age=15552000", "h2")
            assert_once(r, "x-content-type-options", "nosniff", "h2")
        end)
    end)

    it("refuses a tls_nosniff other than 0 or 1", function()
        local r = server.run { args = { "--tls-nosniff", "2", "--print-limits" } }
        assert.are_not.equal(0, r.code)
        assert.truthy(r.stderr:find("tls_nosniff", 1, true), r.stderr)
    end)
end)
