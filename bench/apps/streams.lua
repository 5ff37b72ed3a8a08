-- bench/apps/streams.lua: the app bench/streams.sh measures: an SSE stream kept open, idle,
-- after its handler (`return sse`), and /gc for a full Lua collection before each reading.
local k = require "khamsin"
k.get("/sse", function(req, res)
  local sse = res:sse()
  sse:send{data = "hello"}
  return sse
end)
-- "<Lua heap bytes> <C malloc bytes in use>" after a full collection
k.get("/gc", function()
  collectgarbage()
  collectgarbage()
  return string.format("%d %d", collectgarbage("count") * 1024, require("khamsin.core").malloc_in_use())
end)
