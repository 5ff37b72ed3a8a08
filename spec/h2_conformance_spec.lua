-- spec/h2_conformance_spec.lua: HTTP/2 conformance in raw frames (RFC 9113, RFC 7541), over h2c
-- (prior knowledge) and over TLS (ALPN h2). The cases live in spec/h2/conformance.py, one fresh
-- connection each, written for khamsin along the sections h2spec 2.6 walks; each asserts one
-- exact outcome (the GOAWAY code and the close, or the RST_STREAM code with the connection still
-- answering PING, or the response). Also: frames in flight on a stream the server reset are
-- ignored, and frames allowed on closed streams (WINDOW_UPDATE, RST_STREAM, PRIORITY) are too.
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local SCRIPT = server.root .. "/spec/h2/conformance.py"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
k.post("/", function() return "posted" end)
k.post("/echo", function(req) return req:body() end)
k.get("/slow", function() k.sleep(1); return "slow" end)
k.get("/big", function() return string.rep("x", 100000) end)
]]

local function cases()
    local p = assert(io.popen(PY .. " " .. SCRIPT .. " --list 2>&1", "r"))
    local out = p:read("*a")
    p:close()
    local names = {}
    for line in out:gmatch("[^\n]+") do names[#names + 1] = line end
    assert(#names > 50, "conformance.py --list:\n" .. out)
    return names
end

local NAMES = cases()

local function run(port, tls)
    local cmd = string.format("timeout 600 %s %s %d %s 2>&1", PY, SCRIPT, port, tls and "--tls" or "")
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    local results = {}
    for line in out:gmatch("[^\n]+") do
        local ok, r = pcall(cjson.decode, line)
        if ok and type(r) == "table" and r.name then results[r.name] = r end
    end
    return results, out
end

for _, transport in ipairs { "h2c", "h2 over TLS" } do
    describe("HTTP/2 conformance over " .. transport, function()
        local srv, results, raw
        setup(function()
            srv = server.start { app = APP, args = { "--limit", "body_bytes=100000" } }
            local tls = transport ~= "h2c"
            results, raw = run(tls and srv.tls_listens[1].port or srv.port, tls)
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        for _, name in ipairs(NAMES) do
            it(name, function()
                local r = results[name]
                assert(r, "no result for this case; conformance.py said:\n" .. raw:sub(-2000))
                assert.is_true(r.ok, "want " .. cjson.encode(r.want) .. ", got " .. cjson.encode(r.got))
            end)
        end

        it("passes every case", function()
            local failed = {}
            for _, name in ipairs(NAMES) do
                if not (results[name] and results[name].ok) then failed[#failed + 1] = name end
            end
            assert.are.same({}, failed)
        end)

        it("leaves no [error] line in the log", function()
            assert.are.same({}, srv:unexpected_errors())
        end)
    end)
end
