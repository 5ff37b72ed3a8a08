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
local socket = require "socket"
local cjson = require "cjson"

local NGINX = "/usr/sbin/nginx"

local APP = [[
local k = require "khamsin"
k.get("/admin/*rest", function(req) return "ADMIN " .. req.params.rest end)
k.get("/public", function() return "public" end)
k.get("/files/:name", function(req) return "name=" .. req.params.name end)
k.get("/echo/*rest", function(req) return { path = req.path, target = req.target } end)
]]

local function capture(cmd)
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    return out
end

local function free_port()
    local s = assert(socket.bind("127.0.0.1", 0))
    local _, port = s:getsockname()
    s:close()
    return tonumber(port)
end

local function alive(pid)
    if not pid then return false end
    local r = os.execute("kill -0 " .. pid .. " 2>/dev/null")
    return r == 0 or r == true -- LuaJIT: a status; Lua 5.2+: true
end

-- Starts nginx in front of 127.0.0.1:kport; returns {dir, pid, port} or raises.
local function start_nginx(kport)
    local dir = capture("mktemp -d /tmp/kspec-nginx.XXXXXX"):gsub("%s+$", "")
    assert(dir:match("^/tmp/kspec%-nginx%.%w+$"), "mktemp failed")
    local ngx = { dir = dir }
    for attempt = 1, 5 do
        local port = free_port()
        local conf = table.concat({
            "worker_processes 1;",
            "events { worker_connections 64; }",
            "http {",
            "  access_log off;",
            "  client_body_temp_path " .. dir .. "/body;",
            "  proxy_temp_path " .. dir .. "/proxy;",
            "  fastcgi_temp_path " .. dir .. "/fastcgi;",
            "  uwsgi_temp_path " .. dir .. "/uwsgi;",
            "  scgi_temp_path " .. dir .. "/scgi;",
            "  server {",
            "    listen 127.0.0.1:" .. port .. ";",
            "    location /admin/ { return 403; }",
            "    location / { proxy_pass http://127.0.0.1:" .. kport .. "; }",
            "  }",
            "}",
        }, "\n")
        server.write_file(dir .. "/nginx.conf", conf)
        -- $! is nginx itself (daemon off: the master stays in the foreground)
        local cmd = string.format("cd %s && { %s -p %s -c %s -e stderr -g %s >nginx.log 2>&1 & echo $!; }",
            server.sh_quote(dir), NGINX, server.sh_quote(dir .. "/"), server.sh_quote(dir .. "/nginx.conf"),
            server.sh_quote("daemon off; pid " .. dir .. "/nginx.pid; error_log stderr;"))
        ngx.pid = tonumber(capture(cmd):match("%d+"))
        ngx.port = port
        local up = server.wait_until(10, function()
            if not alive(ngx.pid) then return "dead" end
            local c = socket.tcp()
            c:settimeout(0.2)
            local ok = c:connect("127.0.0.1", port)
            c:close()
            return ok and "up" or nil
        end, 0.05)
        if up == "up" then return ngx end
        -- the port was taken between the probe and nginx's bind, or nginx did not start
        if alive(ngx.pid) then os.execute("kill -KILL " .. ngx.pid .. " 2>/dev/null") end
        ngx.pid = nil
        if attempt == 5 then
            error("nginx did not start:\n" .. (server.read_file(dir .. "/nginx.log") or ""))
        end
    end
end

local function stop_nginx(ngx)
    if not ngx then return end
    if ngx.pid and alive(ngx.pid) then
        os.execute("kill -TERM " .. ngx.pid .. " 2>/dev/null")
        if not server.wait_until(10, function() return not alive(ngx.pid) end, 0.05) then
            os.execute("kill -KILL " .. ngx.pid .. " 2>/dev/null")
        end
    end
    if ngx.dir and ngx.dir:match("^/tmp/kspec%-nginx%.%w+$") then
        os.execute("rm -rf " .. server.sh_quote(ngx.dir))
    end
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
        stop_nginx(ngx)
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
