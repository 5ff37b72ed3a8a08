-- spec/h2_attack_spec.lua: HTTP/2 attacks are refused and other clients are unaffected.
-- Each attack runs in spec/h2/attack.py on its own connection (raw frames) while a
-- well-behaved client on a second connection keeps asking GET / and must get every answer.
-- The attacking connection must end with the GOAWAY code named here (RFC 9113 §5.4.1, §10.5).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local ATTACK = server.root .. "/spec/h2/attack.py"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
k.post("/echo", function(req) return req:body() end)
k.get("/big", function() return string.rep("x", 4 * 1024 * 1024) end)
]]

local function attack(srv, name, wait)
    local cmd = string.format("timeout 60 %s %s %s %d %s 2>&1", PY, ATTACK, name, srv.port, wait or "")
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    local line = out:match("(%b{})%s*$")
    assert(line, "attack.py printed no JSON:\n" .. out)
    return cjson.decode(line)
end

describe("HTTP/2 under attack", function()
    local srv
    setup(function()
        -- write_timeout_ms short so that the window attack ends within the spec's patience
        srv = server.start { app = APP, args = { "--limit", "write_timeout_ms=1000" } }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    local function check(t, code)
        assert.are.equal("table", type(t.goaway), "no GOAWAY: " .. cjson.encode(t))
        if type(code) == "table" then -- any of these
            local ok = false
            for _, c in ipairs(code) do ok = ok or c == t.goaway.code end
            assert.is_true(ok, cjson.encode(t))
        else
            assert.are.equal(code, t.goaway.code, cjson.encode(t))
        end
        assert.is_true(t.closed, "the attacking connection stayed open")
        assert.are.equal(0, t.good_failed, "the other client failed: " .. cjson.encode(t.good_errors))
        assert.is_true(t.good_ok > 0, "the other client got no answer")
        -- and the server still answers a fresh client afterwards
        assert.are.equal(200, srv:request { proto = "h2c", path = "/" }.status)
    end

    it("refuses rapid reset (CVE-2023-44487) with ENHANCE_YOUR_CALM", function()
        local t = attack(srv, "rapid_reset")
        check(t, "ENHANCE_YOUR_CALM")
        -- cut off after h2_peer_resets (200) per second, far before the 20000 pairs
        assert.is_true(t.sent < 20000)
    end)

    it("refuses a flood of malformed requests it must reset (CVE-2019-9514)", function()
        local t = attack(srv, "malformed")
        -- our cap (our own resets count toward h2_peer_resets) says ENHANCE_YOUR_CALM; when
        -- more than h2_max_concurrent_streams arrive in one read, streams not yet reset still
        -- count and nghttp2 ends the connection first with PROTOCOL_ERROR
        check(t, { "ENHANCE_YOUR_CALM", "PROTOCOL_ERROR" })
        assert.is_true(t.sent < 20000)
    end)

    it("refuses a SETTINGS flood with ENHANCE_YOUR_CALM", function()
        check(attack(srv, "settings"), "ENHANCE_YOUR_CALM")
    end)

    it("refuses a PING flood with ENHANCE_YOUR_CALM", function()
        check(attack(srv, "ping"), "ENHANCE_YOUR_CALM")
    end)

    it("refuses a PRIORITY flood with ENHANCE_YOUR_CALM", function()
        check(attack(srv, "priority"), "ENHANCE_YOUR_CALM")
    end)

    it("refuses an empty-DATA flood with ENHANCE_YOUR_CALM", function()
        check(attack(srv, "empty_data"), "ENHANCE_YOUR_CALM")
    end)

    it("refuses a CONTINUATION flood with ENHANCE_YOUR_CALM", function()
        local t = attack(srv, "continuation")
        check(t, "ENHANCE_YOUR_CALM")
    end)

    it("refuses an HPACK bomb (header list over 4 x header_bytes) with ENHANCE_YOUR_CALM", function()
        local t = attack(srv, "hpack_bomb")
        check(t, "ENHANCE_YOUR_CALM")
        assert.are.equal(cjson.null, t.status) -- no request from the bomb reached a handler
    end)

    it("ends a stream whose window is never opened after write_timeout_ms, memory bounded", function()
        local t = attack(srv, "window")
        check(t, "ENHANCE_YOUR_CALM")
        assert.are.equal(200, t.status) -- the head went out (HEADERS are not flow-controlled)
        assert.are.equal(0, t.data_bytes) -- but no DATA: the window was 0
        assert.is_true(t.elapsed >= 0.9 and t.elapsed < 5, "elapsed " .. t.elapsed)
    end)

    it("logs the floods as rate-limited warnings, never as errors", function()
        assert.are.same({}, srv:unexpected_errors())
        assert.truthy(srv:log():match("%[warn%][^\n]*flood from the peer"))
    end)
end)
