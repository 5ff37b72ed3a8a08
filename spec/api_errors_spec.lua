-- The Lua API as a new user meets it (issue 8, item 7): a misuse is refused with a message that
-- names the app's own file:line (never lua/khamsin.lua, never the build machine's source path),
-- counts arguments as the app wrote them, and a handler's odd return values are a clear 500,
-- never a wrong status or a value silently dropped.
local server = require "helpers.server"
local cjson = require "cjson"

-- Each case sits on a line tagged "-- @name"; line(name) is that line's number in app.lua.
local APP = [[
local k = require "khamsin"
local dict = k.shared_dict("d", 65536)
local up = 1
local function msg(ok, e) return ok and "no error" or tostring(e) end

k.get("/blocking-arg", function() return msg(pcall(k.blocking, function(a) return a end, print)) end) -- @blocking-arg
k.get("/blocking-nested", function() return msg(pcall(k.blocking, function() end, 1, { x = { y = io.stdout } })) end) -- @blocking-nested
k.get("/blocking-upvalue", function() return msg(pcall(k.blocking, function() return up end)) end) -- @blocking-upvalue
k.get("/blocking-upvalue-tail", function() return k.blocking(function() return up end) end) -- @blocking-upvalue-tail
k.get("/sleep-arg", function() return msg(pcall(k.sleep, "soon")) end) -- @sleep-arg
k.get("/every-arg", function() return msg(pcall(k.every, 0, function() end)) end) -- @every-arg
k.get("/publish-arg", function() return msg(pcall(k.publish, "t", { f = print })) end) -- @publish-arg
k.get("/dict-value", function() return msg(pcall(dict.set, dict, "key", {})) end) -- @dict-value
k.get("/dict-dot", function() return msg(pcall(dict.get, "key")) end) -- @dict-dot
k.get("/body-dot", function(req) return msg(pcall(req.body)) end) -- @body-dot
k.get("/fail-status", function() return msg(pcall(k.fail, "400", "x")) end) -- @fail-status

k.get("/s201", function() return "201", "x" end) -- @s201
k.get("/nil-err", function() return nil, "not found" end) -- @nil-err
k.get("/four", function() return 200, "x", {}, "extra" end) -- @four
k.get("/204-body", function() return 204, "body" end) -- @204-body
k.get("/res-status", function(req, res) res.status = "201"; return "x" end) -- @res-status
k.get("/res-headers", function(req, res) res.headers = "x-a: 1" end) -- @res-headers
k.get("/hdr-name", function() return 200, "x", { ["bad name"] = "v" } end) -- @hdr-name
k.get("/hdr-value", function() return 200, "x", { ["X-Split"] = "a\r\nSet-Cookie: x=1" } end) -- @hdr-value
k.get("/hdr-key", function() return 200, "x", { "X-A: 1" } end) -- @hdr-key
k.get("/json-fn", function() return { f = print } end) -- @json-fn

k.get("/fail-table", function() k.fail(400, { error = "bad" }) end)
k.get("/fail-bare", function() k.fail(404) end)

local defer_err = "not yet"
k.get("/defer-send", function(req, res)
    local d = res:defer()
    k.timer(0, function()
        local ok, e = pcall(d.send, d, "201", "x") -- @defer-send
        defer_err = ok and "no error" or tostring(e)
    end)
end)
k.get("/defer-err", function() return defer_err end)

k.get("/pending-dot", function(req, res) local d = res:defer(); d:send(200, msg(pcall(d.pending))) end) -- @pending-dot
k.get("/fail-204", function() k.fail(204) end)
k.get("/err-object", function() error(setmetatable({}, { __tostring = function() return "custom-err-7" end })) end)
k.get("/late-route", function() return msg(pcall(k.get, "/late", function() end)) end) -- @late-route
k.get("/traceback", function() return debug.traceback("tb", 1) end)
k.get("/ok", function() return "ok" end)
]]

local function line(name)
    local n = 0
    for l in (APP .. "\n"):gmatch("(.-)\n") do
        n = n + 1
        local tag = "-- @" .. name
        if l:sub(-#tag) == tag then return n end
    end
    error("no line tagged @" .. name)
end

-- "app.lua:<line>:" at the start of msg (short_src may shorten the directory with "...")
local function at(name)
    return "app%.lua:" .. line(name) .. ":"
end

describe("API misuse", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    local function body(path)
        local r = srv:request { path = path }
        assert.are.equal(200, r.status, path .. ": " .. tostring(r.body))
        return r.body
    end

    -- a 500 from the runner: returns the [error] log text it wrote
    local function failed(path)
        local r
        local text = srv:capture_errors(function() r = srv:request { path = path } end)
        assert.are.equal(500, r.status, path .. ": " .. tostring(r.body))
        assert.are.equal("Internal Server Error\n", r.body)
        return text
    end

    describe("k.blocking", function()
        it("numbers the first value after the function as argument 2, as the README does", function()
            local b = body("/blocking-arg")
            assert.truthy(b:find("k.blocking: argument 2: cannot copy a function", 1, true), b)
            b = body("/blocking-nested")
            assert.truthy(b:find("argument 3.x.y: cannot copy a userdata", 1, true), b)
        end)

        it("names the app's line for an uncopyable value and for upvalues", function()
            for _, name in ipairs { "blocking-arg", "blocking-nested", "blocking-upvalue" } do
                local b = body("/" .. name)
                assert.truthy(b:find(at(name)), name .. ": " .. b)
                assert.falsy(b:find("khamsin.lua", 1, true), name .. ": " .. b)
            end
        end)

        it("names the handler when a tail call took the app's line off the stack", function()
            local text = failed("/blocking-upvalue-tail")
            assert.truthy(text:find(at("blocking-upvalue-tail") .. " in the handler defined here: "
                .. "k.blocking: the function has 1 upvalue"), text)
        end)
    end)

    it("names the app's line and the argument for wrong arguments", function()
        local cases = {
            { "sleep-arg", 'k.sleep(seconds): seconds must be a number from 0 to 1e9, got "soon"' },
            { "every-arg", "k.every(seconds, fn): the interval must be above 0, got 0" },
            { "publish-arg", "k.publish: argument 2.f: cannot copy a function" },
            { "dict-value", "dict:set(key, value, ttl): values are strings, numbers, booleans or nil, got a table" },
            { "dict-dot", "dict:get() is a method: call it with a colon" },
            { "body-dot", "req:body() is a method: call it with a colon" },
            { "pending-dot", "d:pending() is a method: call it with a colon" },
            { "late-route", "k.get: routes are declared while the script loads" },
            { "fail-status", 'k.fail(status, message): status must be an integer from 200 to 999, got "400"' },
        }
        for _, c in ipairs(cases) do
            local b = body("/" .. c[1])
            assert.truthy(b:find(at(c[1])), c[1] .. ": " .. b)
            assert.truthy(b:find(c[2], 1, true), c[1] .. ": " .. b)
        end
    end)

    it("refuses k.sleep, k.fail, k.blocking at load time with the script's line", function()
        local r = server.run { app = 'local k = require "khamsin"\nk.sleep(1)\n',
            args = { "--listen", "127.0.0.1:0", "--workers", "1" } }
        assert.are.equal(1, r.code, r.stderr)
        assert.truthy(r.stderr:find("app%.lua:2: k%.sleep can only be called from a handler"), r.stderr)
        r = server.run { app = 'local k = require "khamsin"\nk.fail(400, "x")\n',
            args = { "--listen", "127.0.0.1:0", "--workers", "1" } }
        assert.are.equal(1, r.code, r.stderr)
        assert.truthy(r.stderr:find("app%.lua:2: k%.fail answers a request"), r.stderr)
        r = server.run { app = 'local k = require "khamsin"\n\nk.blocking(function() end)\n',
            args = { "--listen", "127.0.0.1:0", "--workers", "1" } }
        assert.are.equal(1, r.code, r.stderr)
        assert.truthy(r.stderr:find("app%.lua:3: k%.blocking can only be called"), r.stderr)
    end)

    it("names a deferred reply's d:send line (and answers that request 500)", function()
        assert.are.equal(500, srv:request { path = "/defer-send" }.status)
        local b = server.wait_until(5, function()
            local got = body("/defer-err")
            return got ~= "not yet" and got
        end)
        assert.truthy(b:find(at("defer-send")), b)
        assert.truthy(b:find('d:send got "201" (a string), "x" (a string): a status must be a number', 1, true), b)
    end)

    -- (The binary's built-in bytecode: a lua/ file edited after the build loads from its own
    -- path instead, kh_lua_modules.c, and this fails until the next build.)
    it("keeps the build machine's source path out of khamsin's chunk names", function()
        local tb = body("/traceback")
        -- the runner's frames: "khamsin.lua:N:" as the chunk name, nothing before it
        assert.truthy(tb:find("\n\tkhamsin%.lua:%d+: in function"), tb)
        assert.falsy(tb:find("/lua/khamsin", 1, true), tb)
        local text = failed("/s201")
        assert.truthy(text:find("khamsin/errors%.lua:%d+: in function 'raise'"), text)
        assert.falsy(text:find("/lua/khamsin", 1, true), text)
    end)
end)

describe("handler return values", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)

    local function failed(path)
        local r
        local text = srv:capture_errors(function() r = srv:request { path = path } end)
        assert.are.equal(500, r.status, path .. ": " .. tostring(r.body))
        return text
    end

    it('refuses return "201", "x" (a string status) with a 500 naming the handler', function()
        local text = failed("/s201")
        assert.truthy(text:find(at("s201") .. ' in the handler defined here: the handler returned '
            .. '"201" %(a string%), "x" %(a string%): a status must be a number'), text)
    end)

    it("refuses what it used to drop: nil, err; a fourth value; a 204 body; bad res fields", function()
        local cases = {
            { "nil-err", 'the handler returned nil, "not found" (a string) (a failed call\'s nil, err?)' },
            { "four", "the handler returned 4 values" },
            { "204-body", "the handler returned a 4-byte body with the status 204, which has none" },
            { "res-status", 'res.status is "201" (a string): a status is an integer from 200 to 999' },
            { "res-headers", 'res.headers is "x-a: 1" (a string): headers are a table' },
            { "hdr-key", "response header names are strings, got a number key" },
            { "json-fn", "the handler returned a table that cannot be sent as JSON" },
        }
        for _, c in ipairs(cases) do
            local text = failed("/" .. c[1])
            assert.truthy(text:find(at(c[1]), 1), c[1] .. ": " .. text)
            assert.truthy(text:find(c[2], 1, true), c[1] .. ": " .. text)
        end
    end)

    it("names the response header the engine refuses", function()
        local text = failed("/hdr-name")
        assert.truthy(text:find(at("hdr-name")), text)
        assert.truthy(text:find("response header name 'bad name' is not a token", 1, true), text)
        text = failed("/hdr-value")
        assert.truthy(text:find("response header 'X-Split': the value has a control character", 1, true), text)
        assert.are.equal("ok", srv:request { path = "/ok" }.body)
    end)

    server.each_protocol(function(proto)
        it("sends k.fail's table message as JSON over " .. proto, function()
            local r = srv:request { proto = proto, path = "/fail-table" }
            assert.are.equal(400, r.status)
            assert.truthy((r.headers["content-type"] or ""):match("^application/json"), r.headers["content-type"])
            assert.are.same({ error = "bad" }, cjson.decode(r.body))
        end)
    end)

    it("sends k.fail(204) without a body or a Content-Type", function()
        local r = srv:request { path = "/fail-204" }
        assert.are.equal(204, r.status)
        assert.are.equal("", r.body)
        assert.is_nil(r.headers["content-type"])
    end)

    it("logs an error object with __tostring as what it says", function()
        local text = failed("/err-object")
        assert.truthy(text:find("handler error on GET /err-object: custom-err-7", 1, true), text)
    end)

    it("sends the reason phrase for k.fail(status) without a message", function()
        local r = srv:request { path = "/fail-bare" }
        assert.are.equal(404, r.status)
        assert.are.equal("Not Found\n", r.body)
    end)
end)

describe("routes", function()
    local function load_error(body)
        local r = server.run { app = 'local k = require "khamsin"\n' .. body .. "\n",
            args = { "--listen", "127.0.0.1:0", "--workers", "1" } }
        assert.are.equal(1, r.code, r.stderr)
        return r.stderr
    end

    it("refuses a lower-case standard method, which would never match", function()
        local err = load_error('k.route("get", "/x", function() end)')
        assert.truthy(err:find("app%.lua:2: k%.route: methods are case%-sensitive"), err)
    end)

    it("refuses a path with a query, which would never match", function()
        local err = load_error('k.get("/search?q=1", function() end)')
        assert.truthy(err:find("app%.lua:2: k%.get%(path, fn%): '/search%?q=1' has a '%?'"), err)
    end)

    it("names the app's line for a bad pattern", function()
        local err = load_error('k.get("/a/*rest/b", function() end)')
        assert.truthy(err:find("app%.lua:2: route GET /a/%*rest/b: splat must be the last segment"), err)
    end)
end)
