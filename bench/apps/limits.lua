-- bench/apps/limits.lua: the app bench/limits.sh runs at the engine's resource limits.
local k = require "khamsin"
local big = string.rep("x", 1048576)     -- 1 MiB: the pipelining case
local big8 = string.rep("x", 8388608)    -- 8 MiB: the slow-reader cases
k.get("/", function() return "Hello, World!" end)
k.get("/big", function() return big end)
k.get("/big8", function() return big8 end)
