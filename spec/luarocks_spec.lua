-- spec/luarocks_spec.lua: khamsin-scm-1.rockspec installs a working khamsin into a LuaRocks tree.
-- A copy of the sources (CMakeLists.txt, cmake/, core/, lua/, library/, the rockspec) in a
-- temporary directory is built and installed with the README's command, offline:
--   luarocks --lua-version=5.1 --tree=TREE make LUA_INCDIR=/usr/include/luajit-2.1
-- then the copy is deleted (nothing may point back into it), and TREE/bin/khamsin serves
-- examples/hello.lua over cleartext and TLS, started by the khamsin.test installed in the tree.
-- The tree is removed at the end. One cmake build: about a minute, more on a busy machine.
local server = require "helpers.server"

local sh_quote, read_file = server.sh_quote, server.read_file

local function run(cmd)
    local a, b, c = os.execute(cmd)
    if type(a) == "number" then return a == 0 end
    return a == true and b == "exit" and c == 0
end

local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() return true end
    return false
end

describe("luarocks make", function()
    local dir, tree, src, kt, build_log

    setup(function()
        assert(run("command -v luarocks >/dev/null 2>&1"),
            "luarocks is not installed (Debian package luarocks; .ci/deps.sh test installs it)")
        local p = io.popen("mktemp -d /tmp/kspec.XXXXXX")
        dir = p:read("*l")
        p:close()
        assert(dir and dir:match("^/tmp/kspec%.%w+$"), "mktemp failed")
        tree, src = dir .. "/tree", dir .. "/src"
        local root = server.root
        assert(run(string.format("mkdir -p %s && cd %s && cp -r CMakeLists.txt cmake core lua library "
            .. "khamsin-scm-1.rockspec %s/", sh_quote(src), sh_quote(root), sh_quote(src))))
        build_log = dir .. "/build.log"
        local ok = run(string.format("cd %s && timeout 900 luarocks --lua-version=5.1 --tree=%s make "
            .. "LUA_INCDIR=/usr/include/luajit-2.1 >%s 2>&1", sh_quote(src), sh_quote(tree), sh_quote(build_log)))
        assert(ok, "luarocks make failed:\n" .. (read_file(build_log) or ""):sub(-4000))
        assert(run("rm -rf " .. sh_quote(src))) -- the installed rock must not need its sources
        -- the khamsin.test the tree installed, not the checkout's
        local chunk = assert(loadfile(tree .. "/share/lua/5.1/khamsin/test.lua"))
        kt = chunk()
    end)

    teardown(function()
        if dir and not os.getenv("KHAMSIN_SPEC_KEEP") then os.execute("rm -rf " .. sh_quote(dir)) end
    end)

    it("installs the binary, the TLS module, the modules, khamsin.test and the annotations", function()
        for _, f in ipairs { "bin/khamsin", "lib/lua/5.1/khamsin/khamsin-tls.so", "share/lua/5.1/khamsin.lua",
            "share/lua/5.1/khamsin/request.lua", "share/lua/5.1/khamsin/test.lua",
            "share/lua/5.1/khamsin/library/khamsin.lua" } do
            assert.is_true(exists(tree .. "/" .. f), tree .. "/" .. f .. " is missing")
        end
        assert.is_true(run(sh_quote(tree .. "/bin/khamsin") .. " --version | grep -q '^khamsin '"))
    end)

    it("serves examples/hello.lua over h1, h2c, h1 over TLS and h2 from the tree", function()
        local app = kt.start { bin = tree .. "/bin/khamsin", app = server.root .. "/examples/hello.lua",
            tls = true, fail_on_errors = true, timeout = 20 }
        local ok, err = pcall(function()
            for _, proto in ipairs { "h1", "h2c", "h1+tls", "h2" } do
                local res = assert(app:get("/", { proto = proto }))
                assert.are.equal(200, res.status, proto)
                assert.are.equal("Hello, World!", res.body, proto)
            end
            local res = assert(app:post("/echo", "ping", { proto = "h2" }))
            assert.are.equal(201, res.status)
            assert.are.equal("ping", res.body)
        end)
        app:stop()
        assert(ok, err)
        -- the TLS module came from the tree (kh_tls_load.c's rock location)
        assert.is_nil(app:log():find("TLS needs", 1, true))
    end)

    it("runs its built-in modules and looks for Lua files in the tree, not the checkout", function()
        local app = kt.start { bin = tree .. "/bin/khamsin", fail_on_errors = true, timeout = 20, source = [[
local k = require "khamsin"
k.get("/", function()
    return { path = package.path, source = debug.getinfo(k.get, "S").source,
             preloaded = package.preload["khamsin.request"] ~= nil }
end)
]] }
        local res = app:get("/")
        app:stop()
        assert.are.equal(200, res and res.status)
        local body = res.body:gsub("\\/", "/")
        assert.truthy(body:find('"source":"@khamsin.lua"', 1, true), body) -- bytecode, not a file
        assert.truthy(body:find('"preloaded":true', 1, true), body)
        assert.truthy(body:find(tree .. "/bin/../share/lua/5.1/?.lua", 1, true), body)
        assert.is_nil(body:find(server.root, 1, true), body)
        assert.is_nil(body:find(src, 1, true), body)
    end)
end)
