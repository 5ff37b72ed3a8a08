-- nginx in front (issue 8, item 1): nginx normalises the path for its `location` rules and
-- forwards the raw URI (proxy_pass with no URI part). Here `location /admin/ { return 403; }`
-- guards an app whose "/admin/*rest" route must never be reached through nginx: before khamsin
-- routed on the normal form, "/admin/../public" was "/public" to nginx and "/admin/*rest" to us.
--
-- nginx (Debian's /usr/sbin/nginx, .ci/deps.sh) runs as the current user from a temporary
-- prefix (/tmp/kspec-nginx.XXXXXX), daemon off, listening on 127.0.0.1 on a port picked free;
-- teardown stops it (TERM, then KILL) by the pid it started, whatever the tests did, and
-- removes the prefix.
local server = require "helpers.server"
local nginx = require "helpers.nginx"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
k.get("/admin/*rest", function(req) return "ADMIN " .. req.params.rest end)
k.get("/public", function() return "public" end)
k.get("/files/:name", function(req) return "name=" .. req.params.name end)
k.get("/echo/*rest", function(req) return { path = req.path, target = req.target } end)
]]

-- nginx in front of 127.0.0.1:kport (spec/helpers/nginx.lua starts and stops it)
local function start_nginx(kport)
    return nginx.start(function(ports)
        return table.concat({
            "  server {",
            "    listen 127.0.0.1:" .. ports[1] .. ";",
            "    location /admin/ { return 403; }",
            "    location / { proxy_pass http://127.0.0.1:" .. kport .. "; }",
            "  }",
        }, "\n")
    end)
end

-- One request through nginx, the target sent byte for byte.
local function via(ngx, target)
    local c = assert(server.connect("127.0.0.1", ngx.port))
    c:send("GET " .. target .. " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    local data = c:read_until_close(10)
    c:close()
    local r = server.parse_responses(data)[1]
    assert(r, "no response from nginx for " .. target .. ": " .. tostring(data))
    return r
end

describe("nginx in front", function()
    local srv, ngx
    setup(function()
        srv = server.start { app = APP, tls = false }
        ngx = start_nginx(srv.port)
    end)
    teardown(function()
        nginx.stop(ngx)
        if srv then srv:stop() end
    end)

    it("forwards the raw URI to khamsin (the setup the issue describes)", function()
        local r = via(ngx, "/echo/a/../b/%2e%2e/c")
        assert.are.equal(200, r.status)
        local t = cjson.decode(r.body)
        assert.are.equal("/echo/a/../b/%2e%2e/c", t.target) -- raw, as nginx got it
        assert.are.equal("/echo/c", t.path)
        assert.are.equal(403, via(ngx, "/admin/x").status)
    end)

    it("never lets a payload that nginx let through reach the /admin route", function()
        local payloads = {
            "/admin/../public", "/admin/%2e%2e/public", "/admin/%2E%2E/public", "/admin/./../public",
            "/admin/.%2e/public", "/admin/%2e./public", "/admin/%2e/../public", "/admin//../public",
            "/admin/x/../../public", "/admin/%2e%2e/admin/%2e%2e/public",
            -- nginx resolves these to /admin/...: its 403
            "//admin/x", "/%61dmin/x", "/public/../admin/x", "/admin%2Fx", "/public%2F..%2Fadmin/x",
            "/./admin/x", "/x/%2e%2e/admin/",
            -- nginx sees no /admin/ (it decodes %2F): khamsin must not either, or answer 400
            "/files/x%2F..%2F..%2Fadmin", "/files/..%2Fadmin%2Fx", "/admin%2F..%2Fpublic",
            "/x/..%2F..%2Fadmin/y", "/admin/..%2F..%2Fpublic",
            -- nginx splits "q%2Fr" in two, so its ".." pops only "r": "/q/admin/x", proxied.
            -- We keep "q%2Fr" whole: a ".." that would pop it is 400, never "/admin/x".
            "/q%2Fr/../admin/x", "/public%2fx/%2e%2e/admin/x", "/a/b%2F/../../admin/x",
            "/q%5Cr/../admin/x",
            -- above the root, %00, bad escapes, overlong UTF-8
            "/admin/../../public", "/admin/%00/../public", "/admin/%zz/../public",
            "/admin/%C0%AE%C0%AE/public", "/admin\\..\\public",
        }
        local seen = {}
        for _, p in ipairs(payloads) do
            local r = via(ngx, p)
            assert.falsy(r.body:find("ADMIN", 1, true), p .. " reached /admin/*rest: " .. r.body)
            seen[#seen + 1] = p .. " -> " .. r.status
            assert.is_true(r.status == 200 or r.status == 400 or r.status == 403 or r.status == 404,
                p .. " -> " .. r.status)
        end
        -- the first ten are the bypass: they must get "public"
        for i = 1, 10 do
            local r = via(ngx, payloads[i])
            assert.are.equal(200, r.status, payloads[i])
            assert.are.equal("public", r.body, payloads[i])
        end
    end)
end)
