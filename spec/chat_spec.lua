-- spec/chat_spec.lua: examples/chat.lua and examples/dashboard/index.html in headless Chromium
-- (spec/ws/chromium.py drives it over the DevTools protocol), over HTTP/1.1 cleartext and over
-- TLS, where Chromium speaks h2 (ALPN) and so opens its WebSocket by RFC 8441 on that
-- connection. The page opens a WebSocket and an EventSource; once both are open it says a line
-- on the socket; the server publishes it to the room (every worker), and the page must show it
-- in both logs, after the socket's welcome and the feed's hello.
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local DRIVER = server.root .. "/spec/ws/chromium.py"
local APP = 'dofile(' .. string.format("%q", server.root .. "/examples/chat.lua") .. ')'
local GREETING = "hello from the page \xf0\x9f\x8c\x8a"

local function page(url)
    local p = assert(io.popen(PY .. " " .. DRIVER .. " " .. url .. " 'hello from the page' 60", "r"))
    local out = p:read("*a")
    p:close()
    local ok, shown = pcall(cjson.decode, out)
    assert(ok, "driver output: " .. out)
    return shown
end

describe("examples/chat.lua in Chromium", function()
    local srv
    setup(function()
        srv = server.start { app = APP, workers = 2,
            listen = { "tcp://127.0.0.1:0", "tls://127.0.0.1:0" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    local function check(shown, proto, version)
        assert.are.equal(proto, shown.proto)
        assert.are.equal("open", shown.ws_state)
        assert.are.equal("open", shown.sse_state)
        -- the server says which HTTP version carried the WebSocket's handshake
        assert.truthy(shown.ws_log[1]:match("^welcome %d+%-%d+%-%d+ %(worker %d, HTTP/" .. version .. "%)$"),
            shown.ws_log[1])
        assert.are.equal(GREETING, shown.ws_log[2])
        assert.truthy(shown.sse_log[1]:match("^feed open on worker %d$"), shown.sse_log[1])
        assert.are.equal(GREETING, shown.sse_log[2])
    end

    it("shows the WebSocket and SSE messages over HTTP/1.1", function()
        check(page("http://127.0.0.1:" .. srv.port .. "/"), "http/1.1", "1%.1")
    end)

    it("shows them over h2 (TLS), the WebSocket by extended CONNECT", function()
        local tls = srv.tls_listens[1]
        check(page("https://127.0.0.1:" .. tls.port .. "/"), "h2", "2%.0")
    end)
end)
