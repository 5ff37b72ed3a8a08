-- examples/hello.lua: `make run` serves this on 127.0.0.1:8080.
local k = require "khamsin"

k.get("/", function(req)
    return "Hello, World!"
end)

k.get("/users/:id", function(req)
    return { id = req.params.id, agent = req.headers["user-agent"] }
end)

k.post("/echo", function(req, res)
    res.headers["content-type"] = req.headers["content-type"] or "application/octet-stream"
    return 201, req:body()
end)
