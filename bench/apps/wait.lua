-- bench/apps/wait.lua: the handlers bench/wait.sh measures.
local k = require "khamsin"

k.get("/", function() return "Hello, World!" end)
k.get("/health", function() return "ok" end)

-- one k.sleep(0) round trip per loop (?n=100: a hundred per request)
k.get("/sleep0", function(req)
    for _ = 1, tonumber(req.args.n) or 1 do k.sleep(0) end
    return "Hello, World!"
end)

-- one pool round trip that does nothing
local function noop() return "Hello, World!" end
k.get("/pool", function() return k.blocking(noop) end)

-- a deferred reply answered by a timer on the next loop turn
k.get("/defer", function(req, res)
    local d = res:defer()
    k.timer(0, function() d:send("Hello, World!") end)
end)

-- a handler that blocks 100 ms in the pool (the thread waits; no CPU)
k.get("/slow", function() return k.blocking("waitbench_pool.sleep_ms", 100) end)
