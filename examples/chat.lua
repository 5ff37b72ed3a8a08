-- examples/chat.lua: a chat room over WebSocket and Server-Sent Events, across every worker.
--   khamsin examples/chat.lua            then open http://127.0.0.1:8080/
-- A message comes in on a WebSocket (or POST /say), goes to k.publish("chat"), and every worker
-- sends it to its sockets (ws:subscribe) and to its SSE feeds (GET /events). The page is
-- examples/dashboard/index.html (spec/chat_spec.lua drives it in headless Chromium).
local k = require "khamsin"

local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end
-- the page sits next to this file (also when another script loads it with dofile)
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local page = read(here .. "/dashboard/index.html")

k.get("/", function(req, res)
    res.headers["content-type"] = "text/html; charset=utf-8"
    return page
end)

-- WebSocket: every text message is said to the room
k.websocket("/ws", {
    open = function(ws, req)
        ws:subscribe("chat")
        ws:send("welcome " .. ws.id .. " (worker " .. k.worker_id() .. ", HTTP/" .. req.version .. ")")
    end,
    message = function(ws, data, binary)
        if not binary then k.publish("chat", data) end
    end,
})

-- SSE: the same room as a read-only feed
local feeds = {} -- the SSE streams held on this worker
k.subscribe("chat", function(text)
    for sse in pairs(feeds) do sse:send { event = "chat", data = text } end
end)

k.get("/events", function(req, res)
    local sse = res:sse()
    feeds[sse] = true
    sse:on_close(function() feeds[sse] = nil end)
    sse:send { event = "hello", data = "feed open on worker " .. k.worker_id() }
    return sse -- kept open after the handler
end)

-- say something without a socket (curl -d 'hi' http://127.0.0.1:8080/say)
k.post("/say", function(req)
    k.publish("chat", req:body())
    return 204
end)
