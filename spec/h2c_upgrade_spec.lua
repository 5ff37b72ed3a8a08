-- spec/h2c_upgrade_spec.lua: Upgrade: h2c (RFC 7540 §3.2, removed by RFC 9113) is off by
-- default (issue 8, item 2).
--
-- The attack: behind a proxy with the common WebSocket lines (`proxy_http_version 1.1;
-- proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection "upgrade";`), a client asks
-- for an allowed path with Upgrade: h2c. If the backend answers 101, the proxy turns the
-- connection into a tunnel, and the client's HTTP/2 requests, /admin included, reach the backend
-- without passing the proxy's rules. Decisions:
--   * h2c_upgrade = 0 (default): Upgrade: h2c is ignored, the request is served as HTTP/1.1
--     (nginx does the same). h2c with prior knowledge (the preface first) is not affected.
--   * h2c_upgrade = 1: an upgrade needs Connection to list both "upgrade" and "http2-settings"
--     (RFC 7540 §3.2.1; a proxy that rewrites Connection drops the second token, so such a request
--     is served as HTTP/1.1), then exactly one valid HTTP2-Settings: otherwise 400 and close.
local server = require "spec.helpers.server"
local cjson = require "cjson"
local socket = require "socket"

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/h2/h2c_upgrade.py"
local nginx = require "helpers.nginx"

local APP = [[
local k = require "khamsin"
k.get("/", function(req)
    return { version = req.version, upgrade = req.headers.upgrade or false,
             settings = req.headers["http2-settings"] or false }
end)
k.get("/admin", function(req)
    k.log.info("admin served over HTTP/" .. req.version)
    return "secret"
end)
k.post("/echo", function(req) return req:body() end)
]]

-- curl's HTTP2-Settings (MAX_CONCURRENT_STREAMS 100, INITIAL_WINDOW_SIZE 2^30, ENABLE_PUSH 0)
local SETTINGS = "AAMAAABkAARAAAAAAAIAAAAA"

local sh = require("spec.helpers.shell").run

-- The smuggling client against port; returns its JSON report.
local function attempt(port, opt)
    local out = sh("timeout 60 " .. PY .. " " .. CLIENT .. " " .. port .. " "
        .. server.sh_quote(cjson.encode(opt or {})))
    local line = out:match("(%b{})%s*$")
    assert(line, "h2c_upgrade.py printed no JSON:\n" .. out)
    return cjson.decode(line)
end

local function upgrade_request(extra)
    return "GET / HTTP/1.1\r\nHost: x\r\n" .. extra .. "\r\n"
end

-- nginx in front of a khamsin port, with the WebSocket proxy lines and /admin denied
-- (spec/helpers/nginx.lua starts and stops it).
local function start_nginx(backend_port)
    return nginx.start(function(ports)
        return ([[
    server {
        listen 127.0.0.1:PORT;
        location /admin { deny all; }
        location / {
            proxy_pass http://127.0.0.1:BACKEND;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
        }
    }]]):gsub("BACKEND", tostring(backend_port)):gsub("PORT", tostring(ports[1]))
    end)
end

describe("Upgrade: h2c", function()
    describe("by default (h2c_upgrade = 0)", function()
        local srv
        setup(function()
            srv = server.start { app = APP }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        it("serves a well-formed h2c upgrade as HTTP/1.1, the Upgrade ignored", function()
            local r = srv:request { proto = "h1", path = "/", curl_args = { "--http2" } }
            assert.are.equal(200, r.status)
            assert.are.equal("1.1", r.version)
            local t = cjson.decode(r.body)
            assert.are.equal("1.1", t.version)
            assert.are.equal("h2c", t.upgrade)
            assert.are.equal("string", type(t.settings)) -- curl's HTTP2-Settings, passed on as a field
        end)

        it("answers no 101 to python3-h2, and its HTTP/2 request for /admin gets nowhere", function()
            local from = srv:log_size()
            local t = attempt(srv.port, {})
            assert.are.equal(200, t.status)
            assert.is_false(t.upgraded)
            assert.is_true(t.then_status == nil or t.then_status == cjson.null, tostring(t.then_status))
            -- the preface on a connection that already carried a request is refused
            assert.truthy(t.after and t.after:match("^HTTP/1.1 [45]%d%d"), tostring(t.after))
            assert.is_nil(srv:log():sub(from + 1):match("admin served"))
        end)

        it("keeps h2c with prior knowledge", function()
            local r = srv:request { proto = "h2c", path = "/" }
            assert.are.equal(200, r.status)
            assert.are.equal("2", r.version)
        end)
    end)

    describe("with h2c_upgrade = 1", function()
        local srv
        setup(function()
            srv = server.start { app = APP, args = { "--h2c-upgrade", "1" } }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        it("upgrades curl --http2 and answers on stream 1, then more requests over h2", function()
            local r = srv:request { proto = "h1", path = "/", curl_args = { "--http2" } }
            assert.are.equal(200, r.status)
            assert.are.equal("2", r.version)
            assert.are.equal("2.0", cjson.decode(r.body).version)
            local out, code = sh("curl -s --http2 -o /dev/null -o /dev/null -w '%{http_version} %{http_code}\\n' "
                .. srv:url("/") .. " " .. srv:url("/admin"))
            assert.are.equal(0, code)
            assert.are.equal("2 200\n2 200\n", out)
        end)

        it("upgrades python3-h2 directly (what the proxy must not let through)", function()
            local t = attempt(srv.port, {})
            assert.are.equal(101, t.status)
            assert.is_true(t.upgraded)
            assert.are.equal(200, t.stream1_status)
            assert.are.equal(200, t.then_status)
            assert.are.equal("secret", t.then_body)
        end)

        it("takes the two Connection tokens from separate Connection lines", function()
            local raw = srv:raw(upgrade_request("Connection: Upgrade\r\nConnection: HTTP2-Settings\r\n"
                .. "Upgrade: h2c\r\nHTTP2-Settings: " .. SETTINGS .. "\r\n"), { timeout = 5 })
            assert.truthy(raw:match("^HTTP/1.1 101 Switching Protocols\r\n"), raw:sub(1, 200))
        end)

        it("serves HTTP/1.1 when Connection lacks the HTTP2-Settings token (a proxy rewrote it)", function()
            local t = attempt(srv.port, { connection = "upgrade" })
            assert.are.equal(200, t.status)
            assert.is_false(t.upgraded)
            local body = cjson.decode(t.body)
            assert.are.equal("1.1", body.version)
        end)

        it("serves HTTP/1.1 when Connection lacks the upgrade token", function()
            local t = attempt(srv.port, { connection = "HTTP2-Settings" })
            assert.are.equal(200, t.status)
            assert.is_false(t.upgraded)
        end)

        it("keeps HTTP/1.1 for an upgrade request with a body", function()
            local raw = srv:raw("POST /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                .. "Upgrade: h2c\r\nHTTP2-Settings: " .. SETTINGS .. "\r\nContent-Length: 3\r\n"
                .. "Connection: close\r\n\r\nabc", { responses = 1, timeout = 5 })
            local r = server.parse_responses(raw)[1]
            assert.truthy(r, raw)
            assert.are.equal(200, r.status)
            assert.are.equal("abc", r.body)
        end)

        it("never upgrades over TLS (RFC 9113 §3.2: ALPN decides)", function()
            local r = srv:request { proto = "h1+tls", path = "/", headers = {
                { "Connection", "Upgrade, HTTP2-Settings" }, { "Upgrade", "h2c" },
                { "HTTP2-Settings", SETTINGS } } }
            assert.are.equal(200, r.status)
            assert.are.equal("1.1", r.version)
        end)

        local C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        local bad = {
            { "no HTTP2-Settings", C },
            { "two HTTP2-Settings", C .. "HTTP2-Settings: " .. SETTINGS .. "\r\nHTTP2-Settings: " .. SETTINGS .. "\r\n" },
            { "an empty HTTP2-Settings", C .. "HTTP2-Settings:\r\n" },
            { "padding", C .. "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAA=\r\n" },
            { "base64 '+' and '/'", C .. "HTTP2-Settings: AAMAAABk+ARAAAA/\r\n" },
            { "a payload of 7 bytes", C .. "HTTP2-Settings: AAMAAABkAA\r\n" },
            { "ENABLE_PUSH 2", C .. "HTTP2-Settings: AAIAAAAC\r\n" },
            { "INITIAL_WINDOW_SIZE 2^31", C .. "HTTP2-Settings: AASAAAAA\r\n" },
            { "MAX_FRAME_SIZE 2^24", C .. "HTTP2-Settings: AAUBAAAA\r\n" },
        }
        for _, b in ipairs(bad) do
            it("answers 400 and closes for " .. b[1], function()
                local r = server.assert_refused(srv, upgrade_request(b[2]), 400, { timeout = 10 })
                assert.truthy(r.body:match("HTTP2%-Settings"), r.body)
            end)
        end
    end)

    describe("behind nginx with the WebSocket proxy lines", function()
        local ngx, srv
        after_each(function()
            nginx.stop(ngx)
            ngx = nil
            if srv then srv:stop() end
            srv = nil
        end)

        local function smuggle(args)
            srv = server.start { app = APP, tls = false, args = args }
            ngx = start_nginx(srv.port)
            -- nginx itself refuses /admin
            local c = assert(socket.connect("127.0.0.1", ngx.port))
            c:settimeout(10)
            c:send("GET /admin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            local line = c:receive("*l")
            c:close()
            assert.are.equal("HTTP/1.1 403 Forbidden", line)
            local from = srv:log_size()
            local t = attempt(ngx.port, { path = "/", ["then"] = "/admin" })
            return t, srv:log():sub(from + 1)
        end

        it("refuses the smuggling attempt by default: no 101, /admin never reaches khamsin", function()
            local t, log = smuggle {}
            assert.are.equal(200, t.status)
            assert.is_false(t.upgraded)
            assert.are.equal("1.1", cjson.decode(t.body).version)
            assert.is_true(t.then_status == nil or t.then_status == cjson.null, tostring(t.then_status))
            assert.is_nil(log:match("admin served"), log)
        end)

        it("refuses it with h2c_upgrade = 1 too: nginx's Connection lacks HTTP2-Settings", function()
            local t, log = smuggle { "--h2c-upgrade", "1" }
            assert.are.equal(200, t.status)
            assert.is_false(t.upgraded)
            assert.are.equal("1.1", cjson.decode(t.body).version)
            -- khamsin saw the forwarded Upgrade and HTTP2-Settings and still served HTTP/1.1
            assert.are.equal("h2c", cjson.decode(t.body).upgrade)
            assert.is_true(t.then_status == nil or t.then_status == cjson.null, tostring(t.then_status))
            assert.is_nil(log:match("admin served"), log)
        end)
    end)
end)
