-- spec/helpers/upstream.lua: Python peers the outbound specs talk to (broken_server.py,
-- sock_peer.py, h2_goaway_server.py), started and stopped the same way: the script gets a
-- fresh /tmp/kspec.XXXXXX directory and a lifetime in seconds, writes "name port" lines to
-- DIR/ports once it listens, and exits when DIR/quit appears. make_cert() makes a
-- self-signed certificate for an upstream khamsin serving TLS.
local server = require "spec.helpers.server"
local shell = require "spec.helpers.shell"

local M = {}

local PY = "/usr/bin/python3"

-- Starts script (a path); opts.life (seconds the peer lives, default 600) and opts.wait (seconds
-- to wait for its ports, default 20). Returns { dir = ..., ports = { name = port, ... } }.
function M.start(script, opts)
    opts = opts or {}
    local dir = shell.out("mktemp -d /tmp/kspec.XXXXXX"):match("(%S+)")
    assert(dir and dir:match("^/tmp/kspec%."), "mktemp failed")
    os.execute(string.format("%s %s %s %d >%s/out 2>&1 </dev/null & echo $! >%s/pid", PY,
        server.sh_quote(script), dir, opts.life or 600, dir, dir))
    local ports = server.wait_until(opts.wait or 20, function()
        local s = server.read_file(dir .. "/ports")
        if not s then return nil end
        local t = {}
        for name, port in s:gmatch("(%w+) (%d+)") do t[name] = tonumber(port) end
        return t
    end, 0.05)
    assert(ports, script:match("[^/]+$") .. " did not start: " .. tostring(server.read_file(dir .. "/out")))
    return { dir = dir, ports = ports }
end

-- Asks the peer p (from start) to quit, waits up to 5 s for it to exit, removes its directory.
function M.stop(p)
    local f = io.open(p.dir .. "/quit", "wb")
    if f then f:close() end
    local pid = (server.read_file(p.dir .. "/pid") or ""):match("(%d+)")
    server.wait_until(5, function()
        return not pid or os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0
    end, 0.05)
    os.execute("rm -rf " .. server.sh_quote(p.dir))
end

-- A new /tmp/kspec.XXXXXX directory holding key.pem and cert.pem: a self-signed P-256
-- certificate for localhost and 127.0.0.1, valid 2 days. The caller removes the directory.
function M.make_cert()
    local certdir = shell.out("mktemp -d /tmp/kspec.XXXXXX"):match("(%S+)")
    assert(certdir and certdir:match("^/tmp/kspec%."), "mktemp failed")
    local rc = os.execute(string.format("openssl req -x509 -newkey ec -pkeyopt "
        .. "ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost -addext "
        .. "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout %s/key.pem -out %s/cert.pem "
        .. ">/dev/null 2>&1", certdir, certdir))
    assert(rc == 0 or rc == true, "openssl req failed")
    return certdir
end

return M
