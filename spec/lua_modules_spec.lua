-- spec/lua_modules_spec.lua: khamsin's own Lua modules are built into the binary as LuaJIT
-- bytecode (lua/kh_lua_modules.c); $KHAMSIN_LUA_PATH still replaces them with files, and
-- tracebacks still name the source files and lines: relative to lua/ ("khamsin.lua:12",
-- "khamsin/response.lua:80"), never the build machine's absolute path. A module whose source
-- was edited after the build loads from that source, and whether it was is looked at when the
-- module is required (a state pays one stat per module it loads, not one per module built in).
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

    it("an edited source wins, looked at when the module is required", function()
        -- a newer mtime is an edit (content unchanged); restored whatever happens
        local function mtime(f)
            local p = assert(io.popen("stat -c %.9Y " .. sh_quote(f)))
            local t = p:read("*l")
            p:close()
            return t
        end
        local errors_src = server.root .. "/lua/khamsin/errors.lua"
        local cors_src = server.root .. "/lua/khamsin/cors.lua"
        local saved = { [errors_src] = mtime(errors_src), [cors_src] = mtime(cors_src) }
        local ok, err = pcall(function()
            for f in pairs(saved) do assert(os.execute("touch " .. sh_quote(f))) end
            local srv = server.start {
                app = [[
local k = require "khamsin"
k.get("/", function() return type(require("khamsin.cors").new) end)
]],
                args = { "--log-level", "debug" },
            }
            local started = srv:log()
            local r = srv:request { path = "/" }
            local log = srv:log()
            srv:stop()
            assert.are.equal("function", r.body, r.err)
            -- a build without source paths (KH_RELOCATABLE) always uses its bytecode
            if not started:find("khamsin/errors.lua changed since the build", 1, true) then
                assert.falsy(log:find("changed since the build", 1, true), log)
                return
            end
            -- khamsin.errors loads with the app; khamsin.cors only in the handler
            assert.falsy(started:find("khamsin/cors.lua changed since the build", 1, true), started)
            assert.truthy(log:find("khamsin/cors.lua changed since the build", 1, true), log)
        end)
        for f, t in pairs(saved) do os.execute("touch -d @" .. t .. " " .. sh_quote(f)) end
        assert(ok, err)
    end)
end)
