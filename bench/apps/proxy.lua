-- bench/apps/proxy.lua: bench/proxy.sh's khamsin side: every request to /proxy makes one k.http
-- request to the upstream (nginx serving a static answer, keep-alive through k.socket's pool)
-- and answers with its status and body.
local k = require "khamsin"
local UP = "http://127.0.0.1:" .. assert(os.getenv("UPSTREAM_PORT"), "UPSTREAM_PORT") .. "/hello"
k.get("/", function() return "ok" end)
k.get("/proxy", function()
    -- pool_size 64: as many idle upstream connections as nginx's `keepalive 64`
    local res, err = k.http.get(UP, { decode = false, pool_size = 64 })
    if not res then return 502, err end
    return res.status, res.body, { ["Content-Type"] = res.headers["content-type"] }
end)
