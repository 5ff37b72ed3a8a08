-- The Lua garbage of request bodies is collected at the pace it is made (lua/kh_lua_state.c,
-- kh__lua_gc_paid). LuaJIT paces its collector by allocation checks, not bytes: a body chunk
-- of 256 KiB (body_window) that C pushes as one string pays for 1 KiB of collector work, and a
-- handler that makes little other garbage between chunks let the Lua heap grow by about what
-- it read (spec/http_client_mux_spec.lua's proxy: up to 36 MB of Lua heap in a 50 MB upload).
-- Each handler reports the highest Lua heap it saw (collectgarbage("count") after each
-- piece); a heap that never collected would hold the whole upload.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local json = k.json
-- reads the body as it comes, pausing after each chunk so that body_window fills: chunks of
-- up to 256 KiB, and next to no other garbage
k.post("/chunks", function(req)
    local n, chunks, max = 0, 0, 0
    for c in req:body_reader() do
        n, chunks = n + #c, chunks + 1
        local h = collectgarbage("count")
        if h > max then max = h end
        k.sleep(0.002)
    end
    return json.encode { n = n, chunks = chunks, max_kb = max }
end, { stream_body = true })
-- the whole body at once, request after request
local whole_max = 0
k.post("/whole", function(req)
    local b = req:body()
    local h = collectgarbage("count")
    if h > whole_max then whole_max = h end
    return tostring(#b)
end)
k.get("/whole_max", function() return json.encode { max_kb = whole_max } end)
]]

describe("request body garbage", function()
    local srv, dir
    setup(function()
        srv = server.start { app = APP, workers = 1 }
        dir = srv.dir
        -- random bytes: LuaJIT interns strings, and chunks alike would be one string
        assert(os.execute("head -c 50331648 /dev/urandom > " .. dir .. "/big"))
        for i = 1, 8 do
            assert(os.execute("head -c 4194304 /dev/urandom > " .. dir .. "/mid" .. i))
        end
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    it("keeps the Lua heap bounded while a handler reads a 48 MiB body in chunks", function()
        local r = srv:request { method = "POST", path = "/chunks", timeout = 60,
            headers = { ["Content-Type"] = "application/octet-stream" },
            curl_args = { "--data-binary", "@" .. dir .. "/big" } }
        assert.are.equal(200, r.status, r.err or r.body)
        local v = require("cjson").decode(r.body)
        assert.are.equal(50331648, v.n)
        -- without the pacing: 16 MB (ASan build; 3 or 4 cycles in the upload); with it, the
        -- live heap and about 4 MiB of slack: 4.7 MB
        assert.is_true(v.max_kb < 10000, "Lua heap peaked at " .. v.max_kb .. " kB, "
            .. v.chunks .. " chunks")
    end)

    it("keeps the Lua heap bounded over requests that read a 4 MiB body whole", function()
        for i = 1, 8 do
            local r = srv:request { method = "POST", path = "/whole",
                headers = { ["Content-Type"] = "application/octet-stream" },
                curl_args = { "--data-binary", "@" .. dir .. "/mid" .. i } }
            assert.are.equal(200, r.status, r.err or r.body)
            assert.are.equal("4194304", r.body)
        end
        local v = require("cjson").decode(srv:request { path = "/whole_max" }.body)
        -- without the pacing: 31 MB (ASan build); with it, 8.4 MB
        assert.is_true(v.max_kb < 16000, "Lua heap peaked at " .. v.max_kb .. " kB")
    end)
end)
