-- spec/khamsin_test_spec.lua: khamsin.test (lua/khamsin/test.lua), the helper users write their
-- specs with: examples/hello_spec.lua passes under PUC Lua 5.1 as well as LuaJIT (busted runs
-- this file under LuaJIT, .busted); a start failure raises with the log; fail_on_errors turns
-- [error] lines into a failure; a request to a stopped app returns nil and curl's message; with
-- http3 = true the same requests go over HTTP/3 (proto "h3", khamsin's own client kh-h3get).
local server = require "helpers.server"
local kt = require "khamsin.test" -- lua/ is on .busted's lpath

local function run(cmd)
    local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("*a")
    p:close()
    return tonumber(out:match("rc=(%d+)%s*$")), out
end

describe("khamsin.test", function()
    -- kt.start uses $KHAMSIN_BIN, as the helper's users would; make it the spec binary
    local bin = server.bin()

    it("runs examples/hello_spec.lua under PUC Lua 5.1", function()
        local code, out = run("command -v lua5.1 >/dev/null || { echo 'no lua5.1 (Debian package lua5.1)'; exit 1; }; "
            .. "cd " .. server.sh_quote(server.root) .. " && KHAMSIN_BIN=" .. server.sh_quote(bin)
            .. " busted --lua=lua5.1 --output=utfTerminal examples/hello_spec.lua")
        assert.are.equal(0, code, out)
        assert.truthy(out:find("7 successes / 0 failures / 0 errors", 1, true), out)
    end)

    it("raises with the log when the app does not start", function()
        local ok, err = pcall(kt.start, { bin = bin, source = "local k = require 'khamsin'\nk.get(\n" })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("did not start", 1, true), err)
        assert.truthy(tostring(err):find("app.lua:", 1, true), err) -- the load error, file:line
    end)

    it("fails on [error] lines when asked, and returns them otherwise", function()
        local src = [[
local k = require "khamsin"
k.get("/boom", function() error("boom") end)
]]
        local app = kt.start { bin = bin, source = src }
        assert.are.equal(500, assert(app:get("/boom")).status)
        assert.truthy(kt.wait_until(5, function() return #app:errors() > 0 end))
        local code, errs = app:stop()
        assert.are.equal(0, code)
        assert.truthy(errs[1]:find("boom", 1, true))

        app = kt.start { bin = bin, source = src, fail_on_errors = true }
        assert.are.equal(500, assert(app:request { path = "/boom", proto = "h2c" }).status)
        assert.truthy(kt.wait_until(5, function() return #app:errors() > 0 end))
        local ok, err = pcall(app.stop, app)
        assert.is_false(ok)
        assert.truthy(tostring(err):find("[error] lines", 1, true), err)
    end)

    it("returns nil and a message when nothing answers", function()
        local app = kt.start { bin = bin, source = "require('khamsin').get('/', function() return 'x' end)" }
        assert.are.equal("x", assert(app:get("/")).body)
        os.execute("kill -KILL " .. app.pid) -- the server this spec started
        assert.truthy(kt.wait_until(5, function() return app:exit_code() end))
        local res, err = app:get("/", { timeout = 3 })
        assert.is_nil(res)
        assert.truthy(err:find("curl", 1, true), err)
        local ok, serr = pcall(app.stop, app, { fail_on_errors = true })
        assert.is_false(ok)
        assert.truthy(tostring(serr):find("exited by itself with code 137", 1, true), serr)
        res, err = app:get("/")
        assert.is_nil(res)
        assert.truthy(err:find("stopped", 1, true), err)
    end)

    it("makes the same requests over HTTP/3 with http3 = true", function()
        local app = kt.start { bin = bin, http3 = true, source = [[
local k = require "khamsin"
k.get("/", function(req) return "hello " .. req.version end)
k.post("/echo", function(req, res)
    res.headers["X-Got"] = req.headers["x-test"] or "none"
    return 201, req:body()
end)
]] }
        for _, proto in ipairs { "h1", "h2", "h3" } do
            local r = assert(app:request { path = "/", proto = proto })
            assert.are.equal(200, r.status, proto)
            assert.truthy(r.body:find("^hello "), proto)
        end
        local r = assert(app:request { proto = "h3", method = "POST", path = "/echo",
            headers = { ["X-Test"] = "yes" }, body = ("x"):rep(100000) })
        assert.are.equal(201, r.status)
        assert.are.equal("3", r.version)
        assert.are.equal("yes", r.headers["x-got"])
        assert.are.equal(100000, #r.body)
        assert.are.equal(200, assert(app:request { proto = "h3", method = "HEAD", path = "/" }).status)
        app:stop()
    end)

    it("asks for http3 = true when proto h3 is used without it", function()
        local app = kt.start { bin = bin, source = "require('khamsin').get('/', function() return 'x' end)" }
        local ok, err = pcall(app.request, app, { proto = "h3" })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("http3 = true", 1, true), err)
        app:stop()
    end)
end)
