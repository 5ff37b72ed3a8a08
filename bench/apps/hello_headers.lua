-- hello with a request header read and a response header set: bench/callgrind.sh APP= (issue 15:
-- the per-request paths beyond the plain hello). The nginx + lua counterpart, for NGX_LUA=:
-- nginx: content_by_lua_block { local h = ngx.req.get_headers()["host"]; ngx.header["X-Host-Seen"] = h and "yes" or "no"; ngx.header["Content-Type"]="text/plain"; ngx.header["Content-Length"]=13; ngx.print("Hello, World!") }
local k = require "khamsin"
k.get("/", function(req, res)
    local host = req.headers["host"]
    res.headers["X-Host-Seen"] = host and "yes" or "no"
    return "Hello, World!"
end)
