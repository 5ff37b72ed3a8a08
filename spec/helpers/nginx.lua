-- spec/helpers/nginx.lua: run Debian's nginx (/usr/sbin/nginx, .ci/deps.sh) for a spec.
-- Owns:  one temporary prefix (/tmp/kspec-nginx.XXXXXX) per start, the nginx process it started.
-- In:    a function (ports, dir) -> the http block's `upstream`/`server` text, and how many
--        ports it listens on (each picked free here).
-- Out:   {dir, pid, port, ports}: nginx up, every one of its ports accepting (port = ports[1]).
-- Never: talks to anything but loopback, kills a process it did not start, leaves the prefix.
-- daemon off, so $! is the master. Used by the nginx_front, h2c_upgrade and smuggling specs.
local server = require "helpers.server"
local socket = require "socket"

local M = { BIN = "/usr/sbin/nginx" }

local function capture(cmd)
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    return out
end

local free_port = server.free_port

local function alive(pid)
    if not pid then return false end
    local r = os.execute("kill -0 " .. pid .. " 2>/dev/null")
    return r == 0 or r == true
end

-- servers(ports, dir) returns the text of the http block's servers (and upstreams).
function M.start(servers, nports)
    nports = nports or 1
    local dir = capture("mktemp -d /tmp/kspec-nginx.XXXXXX"):gsub("%s+$", "")
    assert(dir:match("^/tmp/kspec%-nginx%.%w+$"), "mktemp failed")
    local ngx = { dir = dir }
    for attempt = 1, 5 do
        local ports = {}
        for i = 1, nports do ports[i] = free_port() end
        local conf = table.concat({
            "worker_processes 1;",
            "events { worker_connections 256; }",
            "http {",
            "  access_log off;",
            "  client_body_temp_path " .. dir .. "/body;",
            "  proxy_temp_path " .. dir .. "/proxy;",
            "  fastcgi_temp_path " .. dir .. "/fastcgi;",
            "  uwsgi_temp_path " .. dir .. "/uwsgi;",
            "  scgi_temp_path " .. dir .. "/scgi;",
            servers(ports, dir),
            "}",
        }, "\n")
        server.write_file(dir .. "/nginx.conf", conf)
        local cmd = string.format("cd %s && { %s -p %s -c %s -e stderr -g %s >nginx.log 2>&1 & echo $!; }",
            server.sh_quote(dir), M.BIN, server.sh_quote(dir .. "/"), server.sh_quote(dir .. "/nginx.conf"),
            server.sh_quote("daemon off; pid " .. dir .. "/nginx.pid; error_log stderr;"))
        ngx.pid = tonumber(capture(cmd):match("%d+"))
        ngx.port, ngx.ports = ports[1], ports
        -- every port: nginx binds them in turn and exits if one is taken (after retries), so
        -- the first one accepting says nothing about the others
        local up = server.wait_until(10, function()
            if not alive(ngx.pid) then return "dead" end
            for _, port in ipairs(ports) do
                local c = socket.tcp()
                c:settimeout(0.2)
                local ok = c:connect("127.0.0.1", port)
                c:close()
                if not ok then return nil end
            end
            return "up"
        end, 0.05)
        if up == "up" then return ngx end
        if alive(ngx.pid) then os.execute("kill -KILL " .. ngx.pid .. " 2>/dev/null") end
        ngx.pid = nil
        if attempt == 5 then
            local log = server.read_file(dir .. "/nginx.log") or ""
            M.stop(ngx)
            error("nginx did not start:\n" .. log)
        end
    end
end

function M.stop(ngx)
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

return M
