-- Responses: what a handler's return values and res.status/res.headers turn into, the headers
-- every response carries, and Lua errors (500, traceback in the log, and in the body under --dev).
--
-- RFC note: "every response has a Content-Length" holds except where RFC 9110 §8.6 forbids
-- it: a 204 (and 1xx) response carries no Content-Length and no body.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"

k.get("/str", function() return "hello" end)
k.get("/tbl", function() return { a = 1, b = "x", list = { 1, 2, 3 } } end)
k.get("/array", function() return { 1, 2, 3 } end)
k.get("/num", function() return 201 end)
k.get("/sb", function() return 202, "accepted" end)
k.get("/sbh", function()
    return 203, "<p>hi</p>", { ["X-Foo"] = "bar", ["Content-Type"] = "text/html; charset=utf-8" }
end)
k.get("/stbl", function() return 400, { error = "bad thing" } end)
k.get("/res", function(req, res)
    res.status = 418
    res.headers["X-Tea"] = "pot"
    return "short and stout"
end)
k.get("/res-only", function(req, res)
    res.status = 202
    res.headers["X-Only"] = "yes"
end)
k.get("/ret-status-overrides", function(req, res)
    res.status = 500
    return 201, "created"
end)
k.get("/ctype", function(req, res)
    res.headers["Content-Type"] = "text/csv"
    return "a,b\n1,2\n"
end)
k.get("/nothing", function() end)
k.get("/empty", function() return "" end)
k.get("/204", function() return 204 end)
k.get("/big", function() return ("0123456789"):rep(100000) end)
k.get("/utf8", function() return "h\195\169llo" end)

k.get("/err", function() error("boom-marker-1234") end)
k.get("/err-table", function() error({}) end)
k.get("/err-nil", function() error(nil) end)
k.get("/err-deep", function()
    local function inner() local t = nil; return t.field end
    return inner()
end)
k.get("/ret-fn", function() return function() end end)
k.get("/ret-ud", function() return newproxy and newproxy() or io.stdout end)
k.get("/ret-bad-status", function() return 99999, "x" end)
]]

local function json(r)
    local ok, t = pcall(cjson.decode, r.body)
    assert(ok, "body is not JSON: " .. tostring(r.body))
    return t
end

describe("responses", function()
    local srv
    setup(function()
        srv = server.start { app = APP }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function get(path)
                return srv:request { proto = proto, path = path }
            end

            it("turns a string into 200 text/plain; charset=utf-8", function()
                local r = get("/str")
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                assert.are.equal("text/plain; charset=utf-8", r.headers["content-type"])
                assert.are.equal("5", r.headers["content-length"])
            end)

            it("counts Content-Length in bytes, not characters", function()
                local r = get("/utf8")
                assert.are.equal("h\195\169llo", r.body)
                assert.are.equal("6", r.headers["content-length"])
            end)

            it("turns a table into 200 application/json", function()
                local r = get("/tbl")
                assert.are.equal(200, r.status)
                assert.truthy((r.headers["content-type"] or ""):match("^application/json"),
                    tostring(r.headers["content-type"]))
                assert.are.same({ a = 1, b = "x", list = { 1, 2, 3 } }, json(r))
                assert.are.same({ 1, 2, 3 }, json(get("/array")))
            end)

            it("takes a lone number as the status, with an empty body", function()
                local r = get("/num")
                assert.are.equal(201, r.status)
                assert.are.equal("", r.body)
                assert.are.equal("0", r.headers["content-length"])
            end)

            it("takes status, body", function()
                local r = get("/sb")
                assert.are.equal(202, r.status)
                assert.are.equal("accepted", r.body)
            end)

            it("takes status, body, headers (which override the Content-Type)", function()
                local r = get("/sbh")
                assert.are.equal(203, r.status)
                assert.are.equal("<p>hi</p>", r.body)
                assert.are.equal("bar", r.headers["x-foo"])
                assert.are.equal("text/html; charset=utf-8", r.headers["content-type"])
            end)

            it("takes status and a table body as JSON", function()
                local r = get("/stbl")
                assert.are.equal(400, r.status)
                assert.are.same({ error = "bad thing" }, json(r))
            end)

            it("uses res.status and res.headers", function()
                local r = get("/res")
                assert.are.equal(418, r.status)
                assert.are.equal("pot", r.headers["x-tea"])
                assert.are.equal("short and stout", r.body)
            end)

            it("sends res.status with an empty body when the handler returns nothing", function()
                local r = get("/res-only")
                assert.are.equal(202, r.status)
                assert.are.equal("yes", r.headers["x-only"])
                assert.are.equal("", r.body)
                assert.are.equal("0", r.headers["content-length"])
            end)

            it("lets a returned status win over res.status", function()
                local r = get("/ret-status-overrides")
                assert.are.equal(201, r.status)
                assert.are.equal("created", r.body)
            end)

            it("keeps a Content-Type set in res.headers", function()
                local r = get("/ctype")
                assert.are.equal("text/csv", r.headers["content-type"])
                assert.are.equal("a,b\n1,2\n", r.body)
            end)

            it("answers 200 with an empty body for a handler that returns nothing", function()
                local r = get("/nothing")
                assert.are.equal(200, r.status)
                assert.are.equal("", r.body)
                assert.are.equal("0", r.headers["content-length"])
                r = get("/empty")
                assert.are.equal(200, r.status)
                assert.are.equal("0", r.headers["content-length"])
            end)

            it("sends a 1 MB body whole", function()
                local r = get("/big")
                assert.are.equal(200, r.status)
                assert.are.equal(1000000, #r.body)
                assert.are.equal("1000000", r.headers["content-length"])
                assert.are.equal(("0123456789"):rep(100000), r.body)
            end)

            it("puts Date, Server and Content-Length on every response, errors included", function()
                for _, path in ipairs { "/str", "/tbl", "/num", "/nothing", "/no-such-route" } do
                    local r = get(path)
                    assert.is_true(server.is_http_date(r.headers.date), path .. ": Date = " .. tostring(r.headers.date))
                    assert.are.equal("khamsin", r.headers.server, path)
                    assert.are.equal(tostring(#r.body), r.headers["content-length"], path)
                end
                local r
                srv:capture_errors(function() r = get("/err") end)
                assert.is_true(server.is_http_date(r.headers.date))
                assert.are.equal("khamsin", r.headers.server)
                assert.are.equal(tostring(#r.body), r.headers["content-length"])
            end)
        end)
    end)

    it("sends a 204 with neither body nor Content-Length (RFC 9110 §8.6)", function()
        local c = srv:raw_conn()
        c:send("GET /204 HTTP/1.1\r\nHost: x\r\n\r\nGET /str HTTP/1.1\r\nHost: x\r\n\r\n")
        local r = assert(c:read_response())
        assert.are.equal(204, r.status)
        assert.is_nil(r.headers["content-length"])
        assert.is_nil(r.headers["transfer-encoding"])
        assert.is_true(server.is_http_date(r.headers.date))
        -- the next response must follow the 204 head directly: no body bytes in between
        local r2 = assert(c:read_response())
        assert.are.equal(200, r2.status)
        assert.are.equal("hello", r2.body)
        c:close()
    end)

    describe("Lua errors", function()
        it("turn into a 500, with the message and traceback in the log, not in the body", function()
            local r
            local text = srv:capture_errors(function() r = srv:request { path = "/err" } end)
            assert.are.equal(500, r.status)
            assert.truthy(text:find("[error]", 1, true), text)
            assert.truthy(text:find("boom-marker-1234", 1, true), "error message not in the log:\n" .. text)
            assert.truthy(text:find("traceback", 1, true), "no traceback in the log:\n" .. text)
            assert.truthy(text:find("app.lua:%d+"), "no app.lua:line in the log:\n" .. text)
            assert.falsy(r.body:find("traceback", 1, true), "traceback leaked into the body without --dev")
            assert.falsy(r.body:find("boom-marker-1234", 1, true), "error message leaked without --dev")
        end)

        it("leave the server answering the next requests", function()
            srv:capture_errors(function()
                for _ = 1, 3 do assert.are.equal(500, srv:request { path = "/err" }.status) end
            end, 3)
            local r = srv:request { path = "/str" }
            assert.are.equal(200, r.status)
            assert.are.equal("hello", r.body)
        end)

        it("leave a keep-alive connection usable (or close it cleanly)", function()
            local c = srv:raw_conn()
            local r
            srv:capture_errors(function()
                c:send("GET /err HTTP/1.1\r\nHost: x\r\n\r\n")
                r = assert(c:read_response())
            end)
            assert.are.equal(500, r.status)
            if (r.headers.connection or ""):lower() == "close" then
                assert.is_true((c:wait_closed(2)))
            else
                c:send("GET /str HTTP/1.1\r\nHost: x\r\n\r\n")
                local r2 = assert(c:read_response())
                assert.are.equal(200, r2.status)
                assert.are.equal("hello", r2.body)
            end
            c:close()
        end)

        it("from a nil index deep in the handler give a 500 and a traceback", function()
            local r
            local text = srv:capture_errors(function() r = srv:request { path = "/err-deep" } end)
            assert.are.equal(500, r.status)
            assert.truthy(text:find("traceback", 1, true), text)
        end)

        for _, path in ipairs { "/err-table", "/err-nil" } do
            it("with a non-string error value (" .. path .. ") give a 500, not a crash", function()
                local r
                srv:capture_errors(function() r = srv:request { path = path } end)
                assert.are.equal(500, r.status)
                assert.are.equal(200, srv:request { path = "/str" }.status)
            end)
        end

        for _, path in ipairs { "/ret-fn", "/ret-ud" } do
            it("returning a value that is no response (" .. path .. ") gives a 500, not a crash", function()
                local r
                srv:capture_errors(function() r = srv:request { path = path } end)
                assert.are.equal(500, r.status)
                assert.are.equal(200, srv:request { path = "/str" }.status)
            end)
        end

        it("returning an out-of-range status gives a 500, not a crash", function()
            local r
            srv:capture_errors(function() r = srv:request { path = "/ret-bad-status" } end)
            assert.are.equal(500, r.status)
            assert.are.equal(200, srv:request { path = "/str" }.status)
        end)
    end)
end)

describe("Lua errors under --dev", function()
    local srv
    setup(function()
        srv = server.start { app = APP, dev = true }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    it("show the message and the traceback in the 500 body", function()
        local r
        local text = srv:capture_errors(function() r = srv:request { path = "/err" } end)
        assert.are.equal(500, r.status)
        assert.truthy(r.body:find("boom-marker-1234", 1, true), r.body)
        assert.truthy(r.body:find("traceback", 1, true), r.body)
        assert.truthy(r.body:find("app.lua:%d+"), r.body)
        assert.truthy(text:find("boom-marker-1234", 1, true), text)
    end)
end)
