-- bench/apps/redis_raw.lua: one SET and one GET in RESP over a cosocket, with the connection
-- pooled: the same code on khamsin's k.socket and on OpenResty's ngx.socket (bench/redis.sh).
local M = {}

local SET = "*3\r\n$3\r\nSET\r\n$6\r\nbench1\r\n$5\r\nhello\r\n"
local GET = "*2\r\n$3\r\nGET\r\n$6\r\nbench1\r\n"

-- tcp: k.socket.tcp or ngx.socket.tcp; idle_ms, size for setkeepalive
function M.getset(tcp, port)
    local s = tcp()
    local ok, err = s:connect("127.0.0.1", port)
    if not ok then return nil, err end
    s:send(SET)
    local line = s:receive("*l")
    if line ~= "+OK" then return nil, "SET: " .. tostring(line) end
    s:send(GET)
    line = s:receive("*l")
    local n = tonumber(line and line:match("^%$(%d+)"))
    if not n then return nil, "GET: " .. tostring(line) end
    local v = s:receive(n + 2)
    s:setkeepalive(60000, 64)
    return v and v:sub(1, n)
end

return M
