-- Request paths (issue 8, item 1): the router matches the normal form of the path (core/kh_path.h),
-- req.path is that form and req.target the raw one; params are decoded per RFC 3986.
-- And (item 7) a 405's Allow lists every method some route answers for the path.
--
-- Decisions (README "Paths" has the user-facing text, core/kh_path.c the reasons):
-- * "." and ".." segments are removed after decoding "%2e" (any case, any position); a ".."
--   above the root is 400. "//" is merged first, as nginx's merge_slashes does.
-- * unreserved escapes are decoded ("%61dmin" is "admin"); "%2F" and "%5C" stay encoded in the
--   path, so they never separate segments; a param gets them decoded, and a param that would
--   then hold a ".." segment is 400.
-- * 400 too: "%00", "%zz" (any bad escape), decoded bytes that are not UTF-8 (overlong "%C0%AE"),
--   a raw '\'.
-- * params: "+" stays "+" (not a form); "%20" is a space.
-- Every payload goes over each protocol (curl --path-as-is sends it as written; h2 :path takes
-- the same normalisation); the backslash, which curl would rewrite, goes raw over h1 and by
-- python3-h2 over h2c.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
k.get("/admin/*rest", function(req) return "ADMIN " .. req.params.rest end)
k.get("/public", function(req) return "public" end)
k.get("/files/:name", function(req) return "name=" .. req.params.name end)
k.get("/p/:v", function(req) return req.params.v end)
k.get("/echo/*rest", function(req)
    return { path = req.path, target = req.target, query = req.query or false, rest = req.params.rest }
end)
k.get("/%7euser/caf\xc3\xa9", function(req) return "tilde " .. req.path end)
]]

local ALLOW_APP = [[
local k = require "khamsin"
k.get("/health", function() return "ok" end)
k.options("/*any", function() return 204 end)
k.post("/items/:id", function() return "post" end)
k.put("/items/*rest", function() return "put" end)
]]

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/h2/client.py"

local function h2py(srv, reqs)
    local cmd = "timeout 60 " .. PY .. " " .. CLIENT .. " requests " .. tostring(srv.port) .. " "
        .. server.sh_quote(cjson.encode(reqs)) .. " 2>&1"
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    local line = out:match("(%b{})%s*$")
    assert(line, "python client printed no JSON:\n" .. out)
    return cjson.decode(line)
end

local function raw1(srv, target, method)
    local data = srv:raw((method or "GET") .. " " .. target .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        { responses = 1 })
    local r = server.parse_responses(data)[1]
    assert(r, "no response to " .. target .. ": " .. tostring(data))
    return r
end

describe("paths", function()
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

            it("never lets a dot segment reach the /admin/*rest route", function()
                for _, p in ipairs {
                    "/admin/../public", "/admin/%2e%2e/public", "/admin/%2E%2E/public",
                    "/admin/.%2e/public", "/admin/%2e./public", "/admin/./../public",
                    "/admin/%2e/../public", "/admin//../public", "/admin/x/../../public",
                    "/admin/%2e%2e/admin/%2E%2E/public",
                } do
                    local r = get(p)
                    assert.are.equal(200, r.status, p)
                    assert.are.equal("public", r.body, p)
                end
            end)

            it("answers 400 to a path that climbs above the root", function()
                for _, p in ipairs { "/..", "/../public", "/%2e%2e/public", "/admin/../../public",
                    "/.%2E/etc/passwd", "//../public" } do
                    local r = get(p)
                    assert.are.equal(400, r.status, p)
                    assert.falsy(r.body:find("ADMIN", 1, true), p)
                end
            end)

            it("shows the normal form in req.path and the raw target in req.target", function()
                local r = get("/echo/a/./b/../%63//d%2f%7E?x=%2e%2e&y=1")
                assert.are.equal(200, r.status)
                local t = cjson.decode(r.body)
                assert.are.equal("/echo/a/c/d%2F~", t.path)
                assert.are.equal("/echo/a/./b/../%63//d%2f%7E?x=%2e%2e&y=1", t.target)
                assert.are.equal("x=%2e%2e&y=1", t.query) -- the query is never touched
                assert.are.equal("a/c/d/~", t.rest)     -- the param decoded: %2F is '/'
            end)

            it("decodes params per RFC 3986, not as a form", function()
                local cases = {
                    { "/p/a+b", "a+b" }, { "/p/a%2Bb", "a+b" }, { "/p/a%20b", "a b" },
                    { "/p/caf%C3%A9", "café" }, { "/p/caf%c3%a9", "café" },
                    { "/p/a%2Fb", "a/b" }, { "/p/%F0%9F%98%80", "\xF0\x9F\x98\x80" },
                    { "/p/%25", "%" }, { "/p/%252e%252e", "%2e%2e" }, { "/p/..%25", "..%" },
                }
                for _, c in ipairs(cases) do
                    local r = get(c[1])
                    assert.are.equal(200, r.status, c[1])
                    assert.are.equal(c[2], r.body, c[1])
                end
            end)

            it("answers 400 to %00, bad escapes and overlong or invalid UTF-8", function()
                for _, p in ipairs { "/p/%00", "/p/a%00b", "/p/%zz", "/p/%", "/p/a%2", "/p/%g1",
                    "/p/%C0%AE", "/p/%C0%AE%C0%AE", "/p/%E0%80%AE", "/p/%C3", "/p/%ED%A0%80",
                    "/p/%F4%90%80%80", "/p/%FF", "/public/%zz", "/%C0%AE%C0%AE/public" } do
                    local r = get(p)
                    assert.are.equal(400, r.status, p)
                end
            end)

            it("keeps %2F inside its segment, and no param ever holds a '..' segment", function()
                -- one segment "admin%2F..%2Fpublic": no route, never /admin/*rest nor /public
                local r = get("/admin%2F..%2Fpublic")
                assert.are.equal(404, r.status)
                r = get("/admin%2fpublic")
                assert.are.equal(404, r.status)
                for _, p in ipairs { "/files/..%2F..%2Fetc%2Fpasswd", "/files/..%2f", "/files/a%2F..",
                    "/files/..%5Cwin.ini", "/files/%2E%2E%2Fx", "/admin/x%2F..%2F..%2Fpublic",
                    "/admin/ok/..%2F..%2F..", "/echo/a/b%2F..%2F..%2F..",
                    -- a proxy decoding %2F pops only "r" here ("/q/admin/x"): never "/admin/x"
                    "/q%2Fr/../admin/x", "/public%2fx/%2e%2e/admin/x", "/q%5Cr/../admin/x" } do
                    r = get(p)
                    assert.are.equal(400, r.status, p)
                    assert.falsy(r.body:find("ADMIN", 1, true), p)
                end
                r = get("/files/a%2Fb.txt")
                assert.are.equal("name=a/b.txt", r.body)
                r = get("/files/..a")
                assert.are.equal("name=..a", r.body) -- not a dot segment
            end)

            it("decodes unreserved escapes and merges slashes before routing", function()
                local r = get("/%61dmin/x")
                assert.are.equal("ADMIN x", r.body)
                r = get("//admin//x")
                assert.are.equal("ADMIN x", r.body)
                r = get("/~user/caf%C3%A9")
                assert.are.equal("tilde /~user/caf%C3%A9", r.body) -- the pattern was normalised too
                r = get("/%7Euser/caf%c3%a9")
                assert.are.equal("tilde /~user/caf%C3%A9", r.body)
            end)
        end)
    end)

    describe("over raw HTTP/1.1", function()
        it("answers 400 to a raw backslash", function()
            for _, p in ipairs { "/admin\\..\\public", "/public\\", "/files/..\\x" } do
                assert.are.equal(400, raw1(srv, p).status, p)
            end
        end)

        it("normalises the path of an absolute-form target", function()
            local r = raw1(srv, "http://x/admin/../public")
            assert.are.equal(200, r.status)
            assert.are.equal("public", r.body)
            r = raw1(srv, "http://x/admin/%2e%2e/%2e%2e/public")
            assert.are.equal(400, r.status)
            r = raw1(srv, "http://x/echo/a/../b")
            assert.are.equal("/echo/b", cjson.decode(r.body).path)
            assert.are.equal("http://x/echo/a/../b", cjson.decode(r.body).target)
        end)

        it("answers OPTIONS * without a route (404), never through one", function()
            assert.are.equal(404, raw1(srv, "*", "OPTIONS").status)
        end)

        it("keeps the connection open after a 400 for a path", function()
            local data = srv:raw("GET /.. HTTP/1.1\r\nHost: x\r\n\r\nGET /public HTTP/1.1\r\nHost: x\r\n"
                .. "Connection: close\r\n\r\n", { responses = 2 })
            local list = server.parse_responses(data)
            assert.are.equal(400, list[1] and list[1].status)
            assert.are.equal(200, list[2] and list[2].status)
            assert.are.equal("public", list[2].body)
        end)
    end)

    describe("over raw h2c (python3-h2)", function()
        it("normalises :path like an HTTP/1.1 target", function()
            local t = h2py(srv, {
                { path = "/admin\\..\\public" }, { path = "/admin/../public" },
                { path = "/admin/%2e%2e/public?q=1" }, { path = "/a#b" }, { path = "/.." },
                { path = "/files/..%2F..%2Fetc" },
            })
            local st = {}
            for i, r in ipairs(t.responses) do st[i] = r.status end
            assert.are.same({ 400, 200, 200, 400, 400, 400 }, st)
            assert.are.equal("public", t.responses[2].body)
            assert.are.equal("public", t.responses[3].body)
        end)
    end)
end)

describe("405 Allow", function()
    local srv
    setup(function()
        srv = server.start { app = ALLOW_APP, tls = false }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    for _, proto in ipairs { "h1", "h2c" } do
        it("lists the methods a less specific route answers (" .. proto .. ")", function()
            local r = srv:request { proto = proto, method = "OPTIONS", path = "/health" }
            assert.are.equal(204, r.status) -- answered by /*any
            r = srv:request { proto = proto, method = "DELETE", path = "/health" }
            assert.are.equal(405, r.status)
            assert.are.equal("GET, HEAD, OPTIONS", r.headers["allow"])
            r = srv:request { proto = proto, method = "DELETE", path = "/items/7" }
            assert.are.equal(405, r.status)
            assert.are.equal("POST, PUT, OPTIONS", r.headers["allow"])
            -- every method listed is really answered
            for m in r.headers["allow"]:gmatch("[^, ]+") do
                local rr = srv:request { proto = proto, method = m, path = "/items/7", body = m ~= "HEAD" and "" or nil }
                assert.are_not.equal(405, rr.status, m)
            end
            r = srv:request { proto = proto, method = "GET", path = "/nothing" }
            assert.are.equal(405, r.status)
            assert.are.equal("OPTIONS", r.headers["allow"])
        end)
    end
end)
