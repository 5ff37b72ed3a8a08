-- The FFI hot path (issue 15, style.md §4): the runner's own reply with up to two string-valued
-- headers goes through kh_lua_respond_fast, req.method / req.path through kh_lua_req_str (lua/kh_lua_core.c);
-- everything else through core.respond / core.head. Both paths must answer alike: the shapes a
-- handler returns, HEAD, a 204, a request read after a wait, and a req kept past its request
-- (stale: its fields are nil, by the generation check).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local kept
k.get("/", function(req) return "Hello, World!" end)
k.get("/created", function() return 201, "made" end)
k.get("/none", function() return 204 end)
k.get("/table", function() return { a = 1 } end)
k.get("/hdr", function(req, res) res.headers["X-A"] = "1"; return "with header" end)
k.get("/hdr2", function(req, res) res.headers["X-A"] = "1"; return 201, "two", { ["X-B"] = "2" } end)
k.get("/hdr3b", function(req, res)
    res.headers["X-A"], res.headers["X-B"], res.headers["X-C"] = "1", "2", "3"
    return "three"
end)
k.get("/hdrnum", function(req, res) res.headers["X-N"] = 7; return "number" end)
k.get("/ctype", function(req, res) res.headers["content-type"] = "text/x-mine"; return "mine" end)
k.get("/badname", function(req, res) res.headers["Bad Name"] = "x"; return "bad" end)
k.post("/fields/:x", function(req) return req.method .. " " .. req.path end)
k.get("/after-wait", function(req) k.sleep(0); return req.method .. " " .. req.path end)
k.get("/keep", function(req) kept = req; return "kept" end)
k.get("/stale", function() return tostring(kept.method) .. " " .. tostring(kept.path) end)
k.get("/gc/stop", function()
    collectgarbage("collect")
    collectgarbage("stop")
    return tostring(collectgarbage("count") * 1024)
end)
k.get("/gc/count", function()
    local n = collectgarbage("count") * 1024
    collectgarbage("restart")
    return tostring(n)
end)
]]

describe("FFI hot path", function()
    local srv
    setup(function()
        srv = server.start { app = APP, expect_errors = { "is not a token" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    for _, proto in ipairs { "h1", "h2c" } do
        if server.wants(proto) then
            it("answers the return shapes alike over " .. proto, function()
                local r = srv:request { path = "/", proto = proto }
                assert.are.equal(200, r.status)
                assert.are.equal("Hello, World!", r.body)
                assert.are.equal("text/plain; charset=utf-8", r.headers["content-type"])
                assert.are.equal("13", r.headers["content-length"])
                assert.is_nil(r.headers["x-request-id"]) -- only a client's own is echoed by default
                r = srv:request { path = "/", proto = proto, headers = { ["X-Request-Id"] = "ffi-" .. proto } }
                assert.are.equal("ffi-" .. proto, r.headers["x-request-id"])
                r = srv:request { path = "/created", proto = proto }
                assert.are.equal(201, r.status)
                assert.are.equal("made", r.body)
                r = srv:request { path = "/none", proto = proto }
                assert.are.equal(204, r.status)
                assert.is_nil(r.headers["content-type"])
                r = srv:request { path = "/table", proto = proto }
                assert.are.equal('{"a":1}', r.body)
                assert.are.equal("application/json", r.headers["content-type"])
                r = srv:request { path = "/hdr", proto = proto }
                assert.are.equal("1", r.headers["x-a"])
                assert.are.equal("with header", r.body)
                -- headers: two of them through the FFI, three or a number through core.respond
                r = srv:request { path = "/hdr2", proto = proto }
                assert.are.same({ 201, "two", "1", "2" },
                    { r.status, r.body, r.headers["x-a"], r.headers["x-b"] })
                r = srv:request { path = "/hdr3b", proto = proto }
                assert.are.same({ "three", "1", "2", "3" },
                    { r.body, r.headers["x-a"], r.headers["x-b"], r.headers["x-c"] })
                r = srv:request { path = "/hdrnum", proto = proto }
                assert.are.same({ "number", "7" }, { r.body, r.headers["x-n"] })
                r = srv:request { path = "/ctype", proto = proto }
                assert.are.same({ "mine", "text/x-mine" }, { r.body, r.headers["content-type"] })
                -- a name the engine refuses: core.respond explains, the request answers 500
                r = srv:request { path = "/badname", proto = proto }
                assert.are.equal(500, r.status)
                r = srv:request { path = "/", method = "HEAD", proto = proto }
                assert.are.equal(200, r.status)
                assert.are.equal("", r.body)
            end)

            it("reads req.method and req.path, after a wait too, over " .. proto, function()
                local r = srv:request { path = "/fields/a%20b?q=1", method = "POST", proto = proto }
                assert.are.equal("POST /fields/a%20b", r.body)
                r = srv:request { path = "/after-wait", proto = proto }
                assert.are.equal("GET /after-wait", r.body)
            end)

            if proto == "h1" then
                -- the runner's req and res never reach the heap in a compiled hello request
                -- (LuaJIT sinks them: res keeps no reference to req, response.new): with the
                -- collector stopped, 2000 requests leave the Lua heap as it was, where one real
                -- table per request (the req that res._req made escape) added ~150 bytes each
                it("a compiled hello request takes no Lua heap (req and res are sunk)", function()
                    local function load(n)
                        local out = io.popen("timeout 60 h2load --h1 -n " .. n .. " -c 4 "
                            .. server.sh_quote(srv:url("/")) .. " 2>&1"):read("*a")
                        assert.truthy(out:match(n .. " succeeded, 0 failed"), out)
                    end
                    load(2000) -- the JIT compiles the request's trace
                    local before = tonumber(srv:request { path = "/gc/stop" }.body)
                    load(2000)
                    local after = tonumber(srv:request { path = "/gc/count" }.body)
                    local per = (after - before) / 2000
                    assert.is_true(per < 32, ("%.1f bytes of Lua heap per request"):format(per))
                end)
            end

            it("gives nil for the fields of a req kept past its request over " .. proto, function()
                assert.are.equal("kept", srv:request { path = "/keep", proto = proto }.body)
                assert.are.equal("nil nil", srv:request { path = "/stale", proto = proto }.body)
            end)
        end
    end
end)
