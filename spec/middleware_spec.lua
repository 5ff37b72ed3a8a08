-- Middleware and error handlers: k.use (global and per prefix) runs for every request, matched
-- or not, in declaration order, before the handler; it may answer, change res (its headers go
-- out on the handler's reply and on the engine's own 404/405/500 pages), or return next() and
-- act after it; waits work inside it. k.on_error(status | "*") replaces the engine's pages; an
-- error inside it falls back to the plain page. Also: an app without middleware keeps the C
-- 404/405 (no Lua runs), and misuse is refused at the app's line.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local order = {}
k.use(function(req, res, next)
    res.headers["X-Mw"] = "1"
    res.headers["X-Route"] = tostring(req.route)
    if req.path == "/blocked" then return 403, "blocked by middleware" end
    if req.args.sleep then k.sleep(0.05) end
    local st, body = next()
    res.headers["X-After"] = tostring(type(st) == "number" and st or res.status)
    return st, body
end)
k.use("/api", function(req, res, next)
    res.headers["X-Api"] = "yes"
    if req.args.sleep then k.sleep(0.05) end
    return next()
end)
k.use("/api", function(req, res, next)
    res.headers["X-Order"] = (res.headers["X-Api"] or "none") .. ",second"
    return next()
end)
k.get("/api/users/:id", function(req) return "user " .. req.params.id .. " " .. req.route end)
k.get("/apix", function(req, res) return "apix " .. tostring(res.headers["X-Api"]) end)
k.get("/hello", function() return "hello" end)
k.post("/hello", function() return "posted" end)
k.get("/fail", function() k.fail(418, "teapot") end)
k.get("/failtable", function() k.fail(422, { error = "bad" }) end)
k.get("/boom", function() error("kaboom") end)
k.get("/twice", function() return "x" end)
k.use("/twice", function(req, res, next) next(); return next() end)
k.on_error(404, function(req, res, err)
    return { error = "nothing at " .. req.path .. " (" .. err.status .. ")" }
end)
k.on_error(418, function(req, res, err) return 418, "custom " .. err.message end)
k.on_error(405, function(req, res, err)
    if req.args.broken then error("handler bug") end
    return "custom 405"
end)
k.on_error("*", function(req, res, err)
    if err.status == 500 then return "custom 500: " .. (err.traceback:match("kaboom") or "?") end
    return nil -- falls to res.status with an empty body
end)
]]

describe("middleware", function()
    local srv
    setup(function()
        srv = server.start { app = APP, expect_errors = { "kaboom", "handler bug", "called twice" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(path, o)
                o = o or {}
                o.proto, o.path = proto, path
                return srv:request(o)
            end

            it("runs before the handler and acts after next(); req.route names the pattern", function()
                local r = req("/hello")
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                assert.are.equal("1", r.headers["x-mw"])
                assert.are.equal("/hello", r.headers["x-route"])
                assert.are.equal("200", r.headers["x-after"])
                assert.is_nil(r.headers["x-api"])
            end)

            it("runs per-prefix middleware in order, on segment boundaries only", function()
                local r = req("/api/users/7")
                assert.are.equal("user 7 /api/users/:id", r.body)
                assert.are.equal("yes", r.headers["x-api"])
                assert.are.equal("yes,second", r.headers["x-order"])
                assert.are.equal("/api/users/:id", r.headers["x-route"])
                r = req("/apix")
                assert.are.equal("apix nil", r.body)
                assert.is_nil(r.headers["x-api"])
            end)

            it("lets a middleware answer", function()
                local r = req("/blocked")
                assert.are.equal(403, r.status)
                assert.are.equal("blocked by middleware", r.body)
            end)

            it("allows waits inside middleware (k.sleep)", function()
                local r = req("/api/users/1?sleep=1")
                assert.are.equal(200, r.status)
                assert.are.equal("user 1 /api/users/:id", r.body)
            end)

            it("sees unmatched requests (req.route nil); on_error(404) answers with JSON", function()
                local r = req("/nowhere")
                assert.are.equal(404, r.status)
                assert.are.equal("application/json", r.headers["content-type"])
                assert.are.equal([[{"error":"nothing at /nowhere (404)"}]], r.body)
                assert.are.equal("1", r.headers["x-mw"])
                assert.are.equal("nil", r.headers["x-route"])
                assert.are.equal("404", r.headers["x-after"])
            end)

            it("answers 405 with Allow through on_error(405) and the middleware headers", function()
                local r = req("/hello", { method = "DELETE" })
                assert.are.equal(405, r.status)
                assert.are.equal("GET, HEAD, POST", r.headers["allow"])
                assert.are.equal("custom 405", r.body)
                assert.are.equal("1", r.headers["x-mw"])
            end)

            it("falls back to the plain page when the error handler fails", function()
                local r = req("/hello?broken=1", { method = "DELETE" })
                assert.are.equal(405, r.status)
                assert.are.equal("Method Not Allowed\n", r.body)
                assert.are.equal("GET, HEAD, POST", r.headers["allow"])
                assert.are.equal("1", r.headers["x-mw"])
            end)

            it("passes k.fail through on_error; '*' catches the rest", function()
                local r = req("/fail")
                assert.are.equal(418, r.status)
                assert.are.equal("custom teapot", r.body)
                r = req("/failtable")
                assert.are.equal(422, r.status)
                assert.are.equal("", r.body) -- '*' returned nil: the status, no body
                assert.are.equal("1", r.headers["x-mw"])
                r = req("/boom")
                assert.are.equal(500, r.status)
                assert.are.equal("custom 500: kaboom", r.body)
                assert.are.equal("1", r.headers["x-mw"])
            end)

            it("refuses a second call of next()", function()
                local r = req("/twice")
                assert.are.equal(500, r.status)
            end)
        end)
    end)

    it("logs the 500's traceback even when an error handler answers", function()
        assert.truthy(srv:log():find("kaboom", 1, true))
        assert.truthy(srv:log():find("error handler for 405 failed", 1, true))
    end)
end)

describe("without middleware", function()
    local srv
    setup(function()
        srv = server.start { app = [[
local k = require "khamsin"
k.get("/x", function(req) return tostring(req.route) end)
]] }
    end)
    teardown(function() if srv then srv:stop() end end)

    it("keeps the engine's own 404/405 and sets req.route", function()
        local r = srv:request { path = "/y" }
        assert.are.equal(404, r.status)
        assert.are.equal("Not Found\n", r.body)
        r = srv:request { path = "/x", method = "POST" }
        assert.are.equal(405, r.status)
        assert.are.equal("GET, HEAD", r.headers["allow"])
        assert.are.equal("/x", srv:request { path = "/x" }.body)
    end)
end)

describe("k.use / k.on_error misuse", function()
    it("refuses bad arguments at the app's line", function()
        local ok, srv = pcall(server.start, { app = [[
local k = require "khamsin"
local function try(f, ...) local ok, e = pcall(f, ...); return e end
local msgs = {
    try(k.use, 42),
    try(k.use, "api", function() end),
    try(k.on_error, 200, function() end),
    try(k.on_error, 404, "x"),
    try(k.cors, { origins = "*", credentials = true }),
    try(k.cors, { origins = { "https://a.example/path" } }),
    try(k.cors, { origin = "*" }),
}
k.get("/m", function() return table.concat(msgs, "\n") end)
k.get("/late", function() local ok, e = pcall(k.use, function() end); return tostring(e) end)
]] })
        assert.truthy(ok, srv)
        local body = srv:request { path = "/m" }.body
        local late = srv:request { path = "/late" }.body
        srv:stop()
        assert.truthy(body:find("app.lua:%d+: k.use%(%[prefix,%] fn%): fn must be a function"), body)
        assert.truthy(body:find("the prefix must be a path starting with '/'", 1, true), body)
        assert.truthy(body:find("status must be an integer from 400 to 599", 1, true), body)
        assert.truthy(body:find("fn must be a function(req, res, err)", 1, true), body)
        assert.truthy(body:find("credentials = true with origins = \"*\"", 1, true), body)
        assert.truthy(body:find("is not an origin like", 1, true), body)
        assert.truthy(body:find("unknown option 'origin'", 1, true), body)
        assert.truthy(late:find("declared while the script loads", 1, true), late)
    end)
end)
