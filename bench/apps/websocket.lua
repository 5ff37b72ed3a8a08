-- bench/apps/websocket.lua: the khamsin side of bench/websocket.sh.
local k = require "khamsin"
k.websocket("/echo", { message = function(ws, data, binary) ws:send(data, binary) end })
k.websocket("/room", { open = function(ws) ws:subscribe("room") end })
k.get("/publish", function(req)
    k.publish("room", string.rep("x", tonumber(req.args.size) or 64))
    return "published"
end)
-- "<Lua heap bytes> <C heap bytes in use>" after a full Lua GC (bench/websocket.sh's idle part)
k.get("/gc", function()
    collectgarbage()
    collectgarbage()
    return string.format("%d %d", collectgarbage("count") * 1024, require("khamsin.core").malloc_in_use())
end)
