-- bench/apps/websocket.lua: the khamsin side of bench/websocket.sh.
local k = require "khamsin"
k.websocket("/echo", { message = function(ws, data, binary) ws:send(data, binary) end })
k.websocket("/room", { open = function(ws) ws:subscribe("room") end })
k.get("/publish", function(req)
    k.publish("room", string.rep("x", tonumber(req.args.size) or 64))
    return "published"
end)
