-- spec/khamsin_test_spec.lua: khamsin.test (lua/khamsin/test.lua), the helper users write their
-- specs with: examples/hello_spec.lua passes under PUC Lua 5.1 as well as LuaJIT (busted runs
-- this file under LuaJIT, .busted); a start failure raises with the log; fail_on_errors turns
-- [error] lines into a failure; a request to a stopped app returns nil and curl's message.
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
end)
