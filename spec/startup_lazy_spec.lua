-- spec/startup_lazy_spec.lua: what start-up leaves for later (issue 15 item 5) is there when it
-- is first used. The math functions LuaJIT takes from libm answer exactly as libm does (the
-- reference: this process's own math library, glibc's libm too), first called from two workers
-- and a k.blocking thread at once: in a KH_LAZY_LIBM build they go through lua/kh_lua_libm.c,
-- which opens libm on that first call. The core table's groups that no plain request touches
-- (lua/kh_lua_core.c, open_rest) appear on the first read of a missing field, once. And what
-- the app sees of libm before any math call is what it saw when ld.so loaded libm at exec:
-- ffi.C.floor resolves, and so does a C module that calls libm without linking it.
local server = require "helpers.server"

-- every libm function LuaJIT calls, by the Lua expression that reaches it
local CASES = {
    { "acos", "math.acos(0.3)" }, { "asin", "math.asin(0.3)" }, { "atan", "math.atan(0.7)" },
    { "atan2", "math.atan2(0.7, -1.3)" }, { "cos", "math.cos(1.1)" }, { "cosh", "math.cosh(1.1)" },
    { "exp", "math.exp(1.7)" }, { "fmod", "math.fmod(7.5, 2.25)" }, { "log", "math.log(10.5)" },
    { "log10", "math.log10(1234.5)" }, { "pow", "math.pow(2.5, 0.3)" }, { "sin", "math.sin(1.1)" },
    { "sinh", "math.sinh(1.1)" }, { "sqrt", "math.sqrt(2)" }, { "tan", "math.tan(1.1)" },
    { "tanh", "math.tanh(1.1)" }, { "pow (^)", "2.5 ^ 0.3" },
}

local function expressions()
    local out = {}
    for i, c in ipairs(CASES) do out[i] = c[2] end
    return table.concat(out, ", ")
end

local APP = [[
local k = require "khamsin"
local fmt = string.format
local function all()
    local v = { ]] .. expressions() .. [[ }
    for i = 1, #v do v[i] = fmt("%.17g", v[i]) end
    return table.concat(v, " ")
end
k.get("/math", function() return all() end)
k.get("/math-pool", function()
    return k.blocking(function()
        local fmt = string.format
        local v = { ]] .. expressions() .. [[ }
        for i = 1, #v do v[i] = fmt("%.17g", v[i]) end
        return table.concat(v, " ")
    end)
end)
k.get("/log2", function() return fmt("%.17g", math.log(1024, 2)) end)
k.get("/groups", function()
    local core = require "khamsin.core"
    local got = {}
    for _, name in ipairs { "socket_new", "http_h1_request", "ws_codec", "shdict_get",
                            "stream_write", "mp_new", "fs_stat" } do
        got[#got + 1] = name .. "=" .. type(core[name])
    end
    got[#got + 1] = "missing=" .. type(core.no_such_field)
    got[#got + 1] = "mt=" .. tostring(getmetatable(core))
    return table.concat(got, " ")
end)
]]

describe("start-up's lazy parts", function()
    local srv
    setup(function()
        srv = server.start { app = APP, workers = 2 }
    end)
    teardown(function() if srv then srv:stop() end end)

    it("math functions answer as libm does, first called from two workers and the pool", function()
        local want = {}
        for i, c in ipairs(CASES) do
            want[i] = string.format("%.17g", assert((loadstring or load)("return " .. c[2]))())
        end
        want = table.concat(want, " ")
        -- several connections, so that both workers and a pool thread make a first call
        local paths = { "/math", "/math", "/math-pool", "/math", "/math-pool", "/math" }
        for _, path in ipairs(paths) do
            local r = srv:request { path = path }
            assert.are.equal(200, r.status)
            if r.body ~= want then
                local got = {}
                for w in r.body:gmatch("%S+") do got[#got + 1] = w end
                local i = 1
                for w in want:gmatch("%S+") do
                    assert.are.equal(w, got[i], CASES[i][1] .. " over " .. path)
                    i = i + 1
                end
            end
        end
        local r = srv:request { path = "/log2" } -- math.log(x, 2): log2
        assert.are.equal("10", r.body)
    end)

    it("the core groups left for later are there on first use", function()
        for _ = 1, 2 do
            local r = srv:request { path = "/groups" }
            assert.are.equal(200, r.status)
            assert.are.equal("socket_new=function http_h1_request=function ws_codec=function "
                .. "shdict_get=function stream_write=function mp_new=function fs_stat=function "
                .. "missing=nil mt=nil", r.body)
        end
    end)
end)

-- a Lua C module calling floor and cbrt (neither is one LuaJIT takes from libm), built without
-- -lm, as LuaRocks builds many: it leans on the libm the process has loaded
local MODULE_C = [[
#include <math.h>
#include <lua.h>
static int f(lua_State *L)
{
    volatile double x = lua_tonumber(L, 1);
    lua_pushnumber(L, floor(x) + cbrt(x));
    return 1;
}
int luaopen_khlibmmod(lua_State *L) { lua_pushcfunction(L, f); return 1; }
]]

-- each app looks libm up at its load, before any math call, a cleartext server (a TLS listener
-- would dlopen its module first, which loads libm)
local APP_FFI = [[
local ffi = require "ffi"
ffi.cdef "double floor(double); double cbrt(double);"
local a, b = ffi.C.floor(2.5), ffi.C.cbrt(27)
local k = require "khamsin"
k.get("/", function() return string.format("%g %g", a, b) end)
]]
local APP_MOD = [[
package.cpath = "DIR/?.so;" .. package.cpath
local c = require "khlibmmod"(8)
local k = require "khamsin"
k.get("/", function() return string.format("%g", c) end)
]]

describe("libm before the first math call", function()
    local dir
    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. dir))
        local f = assert(io.open(dir .. "/khlibmmod.c", "w"))
        f:write(MODULE_C)
        f:close()
        local cflags = io.popen("pkg-config --cflags luajit"):read("*l") or ""
        local ok = os.execute(("cc -O2 -fPIC -shared -fno-builtin %s -o %s/khlibmmod.so %s/khlibmmod.c")
            :format(cflags, dir, dir))
        assert(ok == true or ok == 0, "cc could not build the test module")
    end)
    teardown(function()
        if dir then os.execute("rm -rf " .. dir) end
    end)

    local function answer(app)
        local srv = server.start { workers = 1, tls = false, app = app }
        local r = srv:request { path = "/" }
        srv:stop()
        assert.are.equal(200, r.status)
        return r.body
    end

    it("ffi.C sees libm's functions", function()
        assert.are.equal("2 3", answer(APP_FFI))
    end)

    it("a C module that calls libm without linking it loads and runs", function()
        assert.are.equal("10", answer((APP_MOD:gsub("DIR", dir))))
    end)
end)
