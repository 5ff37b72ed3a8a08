-- spec/tls_provider_spec.lua: khamsin-tls.so loads OpenSSL's default provider through a filter
-- of its own (kh_tls_module.c: 27 of its 124 ciphers, fewer decoders) and without the legacy
-- cipher table (OPENSSL_INIT_NO_ADD_ALL_CIPHERS), to shorten the start-up with a TLS listener
-- (issue 15 item 5). Nothing that worked before may go: here the outbound client (k.http, which
-- offers OpenSSL's default suites) negotiates each kind of suite with `openssl s_server` (TLS 1.3
-- suites; TLS 1.2 AEAD, CBC with SHA-1 (the stitched AES-CBC-HMAC-SHA1), SHA-256 and SHA-384
-- MACs, ECDHE, DHE and RSA key exchange) and verifies its RSA certificate chain.
local server = require "spec.helpers.server"

-- GET /?PORT: a GET of https://127.0.0.1:PORT/, the chain verified against CA
local CLIENT = [[
local k = require "khamsin"
k.get("/", function(req)
    local res, err = k.http.request { url = "https://127.0.0.1:" .. req.query .. "/", cafile = CA }
    if not res then return "ERR " .. tostring(err) end
    return res.status .. " " .. ((res.body or ""):match("Cipher is (%S+)") or "?")
end)
]]

local free_port = server.free_port

-- one `openssl s_server -www` for one connection, offering only `args`' suites; its port
local function s_server(dir, args)
    local port = free_port()
    local log = dir .. "/s_server." .. port .. ".log"
    os.execute(string.format("openssl s_server -accept 127.0.0.1:%d -cert %s/cert.pem -key %s/key.pem %s -www -naccept 1 </dev/null >%s 2>&1 &",
        port, dir, dir, args, log))
    assert(server.wait_until(10, function()
        local f = io.open(log)
        local s = f and f:read("*a") or ""
        if f then f:close() end
        return s:find("ACCEPT", 1, true)
    end), "s_server did not start: " .. (server.read_file(log) or ""))
    return port
end

describe("the TLS module's trimmed OpenSSL set-up", function()
    local cli, dir
    setup(function()
        dir = os.tmpname()
        os.remove(dir)
        assert(os.execute("mkdir -p " .. dir))
        assert(os.execute(string.format("openssl req -x509 -newkey rsa:2048 -nodes -keyout %s/key.pem -out %s/cert.pem -days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 2>/dev/null",
            dir, dir)))
        cli = server.start { app = string.format("local CA = %q\n", dir .. "/cert.pem") .. CLIENT, tls = false }
    end)
    teardown(function()
        if cli then cli:stop() end
        os.execute("rm -rf " .. dir)
    end)

    local function via_client(port)
        return cli:request { path = "/?" .. port, timeout = 20 }.body
    end

    for _, suite in ipairs { "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256" } do
        it("lets the client negotiate " .. suite, function()
            local port = s_server(dir, "-tls1_3 -ciphersuites " .. suite)
            assert.are.equal("200 " .. suite, via_client(port))
        end)
    end
    for _, suite in ipairs { "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-CHACHA20-POLY1305", "ECDHE-RSA-AES128-SHA",
        "ECDHE-RSA-AES256-SHA384", "DHE-RSA-AES256-GCM-SHA384", "AES128-SHA256" } do
        it("lets the client negotiate TLS 1.2's " .. suite, function()
            local port = s_server(dir, "-tls1_2 -cipher " .. suite)
            assert.are.equal("200 " .. suite, via_client(port))
        end)
    end
end)
