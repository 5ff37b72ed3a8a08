-- Workers that talk: k.publish(topic, value) reaches k.subscribe(topic, fn) on every worker,
-- with the value copied.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local seen = k.shared_dict("seen", 65536)
k.subscribe("news", function(v, topic)
    k.sleep(0) -- subscribers run in a coroutine: they may wait
    seen:set("w" .. k.worker_id() .. ":" .. v.id, v.text .. "/" .. #v.list .. "/" .. topic)
    v.text = "changed" -- a copy: the publisher's table is not touched
end)
k.subscribe("boom", function() error("subscriber failure") end)
k.get("/publish/:id", function(req)
    local v = { id = req.params.id, text = "hello", list = { 1, 2, 3 } }
    local n = k.publish("news", v)
    return n .. " " .. v.text
end)
k.get("/boom", function() k.publish("boom", true); return "published" end)
k.get("/bad", function() local ok, e = pcall(k.publish, "news", { f = print }); return e end)
k.get("/seen/:key", function(req) return tostring(seen:get(req.params.key)) end)
]]

describe("publish / subscribe", function()
    local srv
    setup(function() srv = server.start { app = APP, workers = 2 } end)
    teardown(function() if srv then srv:stop() end end)

    it("reaches the subscribers of every worker, with a copy of the value", function()
        local r = srv:request { path = "/publish/1" }
        assert.are.equal("2 hello", r.body)
        for _, w in ipairs { "w0", "w1" } do
            local got = server.wait_until(2, function()
                local b = srv:request { path = "/seen/" .. w .. ":1" }.body
                return b ~= "nil" and b
            end)
            assert.are.equal("hello/3/news", got)
        end
    end)

    it("logs a failing subscriber and goes on", function()
        local log = srv:capture_errors(function()
            assert.are.equal("published", srv:request { path = "/boom" }.body)
        end, 2)
        assert.truthy(log:find("subscriber of 'boom' failed"), log)
        assert.are.equal("2 hello", srv:request { path = "/publish/2" }.body)
    end)

    it("refuses a value it cannot copy", function()
        local b = srv:request { path = "/bad" }.body
        assert.truthy(b:find("cannot copy a function"), b)
    end)
end)
