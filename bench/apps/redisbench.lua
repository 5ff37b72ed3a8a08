-- bench/apps/redisbench.lua: Redis round trips from khamsin handlers (bench/redis.sh). Each request
-- does one SET and one GET (2 round trips) on a pooled connection:
--   /lua-redis  Debian's lua-redis (redis-lua) on k.socket (package.loaded.socket = luasocket())
--   /raw        a minimal RESP exchange written on k.socket (bench/apps/redis_raw.lua)
--   /blocking   lua-redis on real luasocket in a k.blocking pool thread (the way before)
local k = require "khamsin"
local PORT = tonumber(os.getenv("REDIS_PORT"))
package.loaded.socket = k.socket.luasocket { pool_size = 64, backlog = 10000 }
local redis = require "redis"
local raw = require "redis_raw"

k.get("/lua-redis", function()
    local c = redis.connect("127.0.0.1", PORT)
    c:set("bench1", "hello")
    local v = c:get("bench1")
    c.network.socket:setkeepalive(60000, 64)
    return v
end)
k.get("/raw", function() return assert(raw.getset(k.socket.tcp, PORT)) end)
k.get("/blocking", function() return k.blocking("redis_pool.getset", PORT) end)
k.get("/", function() return "ok" end)
