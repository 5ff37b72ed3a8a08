-- bench/apps/first_answer.lua: bench/startup.sh's callgrind part. The first request ends the
-- process (_exit in the handler: neither atexit handlers such as OPENSSL_cleanup, ~1.4 M
-- instructions, nor Lua's close run, since they come after the answer), so an instruction count
-- of the whole run is exec -> the first request reaching Lua: start-up, accept, TLS handshake
-- when there is one, parsing.
local ffi = require "ffi"
ffi.cdef "void _exit(int status);"
local k = require "khamsin"
k.get("/", function(req) ffi.C._exit(0) end)
