-- bench/apps/first_answer.lua: bench/startup.sh's callgrind part. The first request ends the
-- process (os.exit in the handler), so an instruction count of the whole run is exec -> the
-- first request reaching Lua: start-up, accept, TLS handshake when there is one, parsing.
local k = require "khamsin"
k.get("/", function(req) os.exit(0) end)
