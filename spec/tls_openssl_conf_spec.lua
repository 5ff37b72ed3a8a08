-- spec/tls_openssl_conf_spec.lua: khamsin-tls.so initialises OpenSSL without reading
-- openssl.cnf (start-up cost, issue 15 item 5) unless OPENSSL_CONF names a file, which is then
-- applied: here a file whose system_default section allows only TLS_CHACHA20_POLY1305_SHA256.
-- The client is curl with one TLS 1.3 suite offered at a time; strace -e openat says which
-- configuration files a start-up with a TLS listener opens.
local server = require "spec.helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "hello" end)
]]

local CONF = [[
openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
Ciphersuites = TLS_CHACHA20_POLY1305_SHA256
]]

local function get(srv, suite)
    local cmd = string.format("curl -sk --max-time 10 --tlsv1.3 --tls13-ciphers %s -o - -w ' %%{http_code}' https://127.0.0.1:%d/ 2>&1",
        suite, srv.port)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    return out
end

local BIN = os.getenv("KHAMSIN_BIN") or (server.root .. "/build/khamsin")

-- the paths a start-up with a TLS listener opens (the app exits while it loads, after the
-- TLS context is built: main.c builds it before any worker loads the app)
local function opened(env)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local f = assert(io.open(dir .. "/exit.lua", "w"))
    f:write("os.exit(0)\n")
    f:close()
    local cmd = string.format("cd %s && %s timeout 60 strace -f -qq -e trace=openat -o trace.txt %s --workers 1 --listen tls://127.0.0.1:0 --tls-self-signed exit.lua >log.txt 2>&1; cat trace.txt",
        dir, env or "", server.sh_quote(BIN))
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    os.execute("rm -rf " .. dir)
    return out
end

describe("OpenSSL's configuration file", function()
    it("is not opened at start-up unless OPENSSL_CONF names one", function()
        local trace = opened("env -u OPENSSL_CONF")
        -- the module is opened (OpenSSL is in it with KH_STATIC_OPENSSL, else libssl.so too)
        assert.truthy(trace:find("khamsin-tls.so", 1, true), "strace saw no khamsin-tls.so: " .. trace:sub(1, 2000))
        assert.falsy(trace:find("openssl.cnf", 1, true), trace)
        local path = os.tmpname()
        local cf = assert(io.open(path, "w"))
        cf:write(CONF)
        cf:close()
        finally(function() os.remove(path) end)
        trace = opened("env OPENSSL_CONF=" .. server.sh_quote(path))
        assert.truthy(trace:find(path, 1, true), trace)
    end)

    it("is not needed: both suites work without OPENSSL_CONF", function()
        local srv = server.start { app = APP, tls = true, env = { OPENSSL_CONF = "" } }
        finally(function() srv:stop() end)
        assert.are.equal("hello 200", get(srv, "TLS_AES_128_GCM_SHA256"))
        assert.are.equal("hello 200", get(srv, "TLS_CHACHA20_POLY1305_SHA256"))
    end)

    it("keeps the order of a suite list set in it (khamsin reorders only OpenSSL's default)", function()
        local path = os.tmpname()
        local f = assert(io.open(path, "w"))
        f:write((CONF:gsub("Ciphersuites = [^\n]*", "Ciphersuites = TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256")))
        f:close()
        finally(function() os.remove(path) end)
        local srv = server.start { app = APP, tls = true, env = { OPENSSL_CONF = path } }
        finally(function() srv:stop() end)
        local l = srv.tls_listens[1]
        local p = assert(io.popen(string.format("printf 'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' | timeout 10 openssl s_client -tls1_3 -ign_eof -connect %s:%d 2>&1", l.host, l.port)))
        local out = p:read("*a")
        p:close()
        assert.truthy(out:find("Cipher is TLS_AES_256_GCM_SHA384", 1, true), out)
        assert.truthy(out:find("hello", 1, true), out)
    end)

    it("named by OPENSSL_CONF is applied", function()
        local path = os.tmpname()
        local f = assert(io.open(path, "w"))
        f:write(CONF)
        f:close()
        finally(function() os.remove(path) end)
        local srv = server.start { app = APP, tls = true, env = { OPENSSL_CONF = path } }
        finally(function() srv:stop() end)
        assert.are.equal("hello 200", get(srv, "TLS_CHACHA20_POLY1305_SHA256"))
        assert.are_not.equal("hello 200", get(srv, "TLS_AES_128_GCM_SHA256"))
    end)
end)
