-- bench/apps/redis_pool.lua: the way before k.socket: lua-redis on blocking luasocket, in a
-- k.blocking pool thread, one persistent connection per thread (bench/redis.sh).
local M = {}
local client

function M.getset(port)
    if not client then client = require("redis").connect("127.0.0.1", port) end
    client:set("bench1", "hello")
    return client:get("bench1")
end

return M
