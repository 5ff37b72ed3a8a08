-- bench/reload.sh appends this to a copy of examples/hello.lua for the idle-instance memory:
-- /hold is a deferred reply that is never answered (it keeps its instance alive while its
-- connection stays), /held counts them, /gen is the generation that serves (an internal call).
local k = require "khamsin"
local dict = k.shared_dict("reload_bench", 65536)
k.get("/hold", function(req, res)
    res:defer { timeout = 600 }
    dict:incr("held", 1, 0)
end)
k.get("/held", function() return tostring(dict:get("held") or 0) end)
k.get("/gen", function() return tostring(require("khamsin.core").gen()) end)
