-- spec/helpers/h3.lua: what the HTTP/3 specs share: the paths of our QUIC tools (built next to
-- $KHAMSIN_BIN), running one with its exit code, and the UDP port a server listens on for QUIC.
local server = require "helpers.server"

local M = {}

-- The path of tool name (kh-h3get, kh-h3load) next to the khamsin binary under test.
function M.tool(name)
    return (server.bin():gsub("[^/]+$", name))
end

function M.h3get_bin()
    return M.tool("kh-h3get")
end

-- Runs cmd (a shell line); returns its stdout+stderr and its exit code.
function M.run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"__rc=$?\"", "r"))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("__rc=(%d+)%s*$"))
    return (out:gsub("__rc=%d+%s*$", "")), rc
end

-- srv's QUIC port, from its log (the helper waits for the tcp/tls lines; the quic one follows in
-- a write of its own); waits up to timeout seconds (default 5).
function M.quic_port(srv, timeout)
    return tonumber(srv:wait_log("listening on 127%.0%.0%.1:(%d+) %(quic%)", timeout or 5))
end

return M
