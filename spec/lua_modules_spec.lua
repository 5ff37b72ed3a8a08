-- spec/lua_modules_spec.lua: khamsin's own Lua modules are built into the binary as LuaJIT
-- bytecode (lua/kh_lua_modules.c); $KHAMSIN_LUA_PATH still replaces them with files, and
-- tracebacks still name the source files and lines: relative to lua/ ("khamsin.lua:12",
-- "khamsin/response.lua:80"), never the build machine's absolute path.
local server = require "helpers.server"

local sh_quote = server.sh_quote

describe("khamsin's Lua modules", function()
    it("tracebacks through them name khamsin.lua and a line, without the build path", function()
        local srv = server.start {
            app = [[
local k = require "khamsin"
k.get("/", function() error("boom") end)
]],
            expect_errors = { "boom" },
        }
        local r = srv:request { path = "/" }
        assert.are.equal(500, r.status)
        assert.truthy(srv:wait_log("boom", 2))
        local log = srv:log()
        srv:stop()
        assert.truthy(log:find("\n\tkhamsin%.lua:%d+: in function"), log)
        assert.falsy(log:find(server.root .. "/lua/", 1, true), log)
    end)

    it("come from $KHAMSIN_LUA_PATH when it is set", function()
        local p = assert(io.popen("mktemp -d /tmp/kspec.XXXXXX"))
        local dir = p:read("*l")
        p:close()
        assert(os.execute("cp -r " .. sh_quote(server.root .. "/lua/khamsin.lua") .. " "
            .. sh_quote(server.root .. "/lua/khamsin") .. " " .. sh_quote(dir)))
        local src = server.read_file(dir .. "/khamsin.lua")
        server.write_file(dir .. "/khamsin.lua", (src:gsub("\nreturn k%s*$", "\nk.from_copy = true\nreturn k\n")))
        local app = [[
local k = require "khamsin"
k.get("/", function() return tostring(k.from_copy) end)
]]
        local ok, err = pcall(function()
            local srv = server.start { app = app, env = { KHAMSIN_LUA_PATH = dir } }
            local r = srv:request { path = "/" }
            srv:stop()
            assert.are.equal("true", r.body, r.err)
            srv = server.start { app = app }
            r = srv:request { path = "/" }
            srv:stop()
            assert.are.equal("nil", r.body, r.err)
        end)
        os.execute("rm -rf " .. sh_quote(dir))
        assert(ok, err)
    end)
end)
