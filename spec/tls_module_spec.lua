-- spec/tls_module_spec.lua: TLS lives in khamsin-tls.so (core/kh_tls_module.h), which the binary
-- loads only when a TLS listener is configured: a cleartext server never maps OpenSSL (a few ms
-- of start-up on a small VM), a TLS server does and answers, and a TLS server whose module is
-- missing says which paths it tried and exits non-zero. OpenSSL is linked into the module by
-- default (KH_STATIC_OPENSSL in CMakeLists.txt), else the module needs libssl.so and libcrypto.so.
local server = require "helpers.server"

local sh_quote = server.sh_quote

local function run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"__rc=$?\"", "r"))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("__rc=(%d+)%s*$"))
    return out:gsub("__rc=%d+%s*$", ""), rc
end

-- The shared objects a running server has mapped, by file name.
local function mapped(pid)
    local f = assert(io.open("/proc/" .. pid .. "/maps", "r"))
    local libs = {}
    for line in f:lines() do
        local path = line:match("%s(/%S+)$")
        if path then libs[path:match("[^/]+$")] = path end
    end
    f:close()
    return libs
end

local function has(libs, prefix)
    for name in pairs(libs) do
        if name:sub(1, #prefix) == prefix then return name end
    end
    return false
end

describe("the TLS module", function()
    it("is not a DT_NEEDED of the binary: libssl and libcrypto are not linked in", function()
        local out, rc = run("readelf -d " .. sh_quote(server.bin()))
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("NEEDED", 1, true), out)
        assert.falsy(out:find("libssl", 1, true), out)
        assert.falsy(out:find("libcrypto", 1, true), out)
    end)

    it("is not loaded by a cleartext-only server, which still answers", function()
        local srv = server.start { tls = false }
        local ok, err = pcall(function()
            local r = srv:request { proto = "h1" }
            assert.are.equal(200, r.status, r.err)
            local libs = mapped(srv.pid)
            assert.truthy(has(libs, "libc"), "maps lists the shared objects")
            assert.falsy(has(libs, "libssl"))
            assert.falsy(has(libs, "libcrypto"))
            assert.falsy(has(libs, "khamsin-tls"))
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("is loaded with OpenSSL by a TLS server, which answers over TLS", function()
        local srv = server.start { tls = true }
        local ok, err = pcall(function()
            local r = srv:request { proto = "h1+tls" }
            assert.are.equal(200, r.status, r.err)
            assert.are.equal("ok", r.body)
            r = srv:request { proto = "h2" }
            assert.are.equal(200, r.status, r.err)
            local libs = mapped(srv.pid)
            local mod = has(libs, "khamsin-tls.so")
            assert.truthy(mod)
            -- OpenSSL is linked into the module (KH_STATIC_OPENSSL), or the module needs the
            -- shared libraries, which are then mapped
            local dyn = run("readelf -d " .. sh_quote(libs[mod]))
            local shared = dyn:find("libssl", 1, true) ~= nil
            assert.are.equal(shared, has(libs, "libssl") ~= false, dyn)
            assert.are.equal(shared, has(libs, "libcrypto") ~= false, dyn)
        end)
        srv:stop()
        assert(ok, err)
    end)

    describe("when missing", function()
        local dir, bin
        setup(function()
            local p = assert(io.popen("mktemp -d /tmp/kspec.XXXXXX"))
            dir = p:read("*l")
            p:close()
            bin = dir .. "/kh-copy" -- a binary with no module next to it
            assert(os.execute("cp " .. sh_quote(server.bin()) .. " " .. sh_quote(bin)))
            server.write_file(dir .. "/app.lua", 'require("khamsin").get("/", function() return "ok" end)')
        end)
        teardown(function()
            if dir and dir:match("^/tmp/kspec%.%w+$") then os.execute("rm -rf " .. sh_quote(dir)) end
        end)

        it("a TLS server exits non-zero naming the paths it tried", function()
            local out, rc = run("timeout 10 " .. sh_quote(bin) .. " --listen 127.0.0.1:0 --tls-self-signed "
                .. sh_quote(dir .. "/app.lua"))
            assert.are_not.equal(0, rc)
            assert.are_not.equal(124, rc, "it did not exit")
            assert.truthy(out:find(dir .. "/khamsin-tls.so", 1, true), out)
            assert.truthy(out:find(dir .. "/../lib/khamsin/khamsin-tls.so", 1, true), out)
            assert.truthy(out:find("KHAMSIN_TLS_MODULE", 1, true), out)
        end)

        it("KHAMSIN_TLS_MODULE names the module; a wrong one is reported", function()
            local out, rc = run("KHAMSIN_TLS_MODULE=" .. sh_quote(dir .. "/nope.so") .. " timeout 10 "
                .. sh_quote(bin) .. " --listen tls://127.0.0.1:0 --tls-self-signed " .. sh_quote(dir .. "/app.lua"))
            assert.are_not.equal(0, rc)
            assert.are_not.equal(124, rc, "it did not exit")
            assert.truthy(out:find(dir .. "/nope.so", 1, true), out)
        end)

        -- server.start runs server.bin(): point it at the copy for these two
        local function with_copy(fn)
            local real = server.bin
            local module = real():match("^(.*)/[^/]*$") .. "/khamsin-tls.so"
            server.bin = function() return bin end
            local ok, err = pcall(fn, module)
            server.bin = real
            assert(ok, err)
        end

        it("a cleartext server runs without it", function()
            with_copy(function()
                local srv = server.start { tls = false }
                local r = srv:request { proto = "h1" }
                srv:stop()
                assert.are.equal(200, r.status, r.err)
            end)
        end)

        it("KHAMSIN_TLS_MODULE pointing at the module makes TLS work", function()
            with_copy(function(module)
                local srv = server.start { tls = true, env = { KHAMSIN_TLS_MODULE = module } }
                local r = srv:request { proto = "h1+tls" }
                srv:stop()
                assert.are.equal(200, r.status, r.err)
            end)
        end)
    end)
end)
