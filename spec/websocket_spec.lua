-- spec/websocket_spec.lua: k.websocket conformance over HTTP/1.1 (GET + Upgrade, RFC 6455) and
-- HTTP/2 (extended CONNECT, RFC 8441), by the case families of the Autobahn suite: framing,
-- pings/pongs, reserved bits, opcodes, fragmentation, UTF-8 (invalid sequences split across
-- fragments, fail-fast), close handling and codes, limits, permessage-deflate (RFC 7692); plus
-- the handshake checks. Each case asserts the exact frames the server sent back (echo, pong,
-- close code).
-- Clients: spec/ws/wsclient.py (raw frames over a socket on h1; python3-h2 on h2, the server's
-- frames decoded a second time by python3-wsproto), spec/ws/wslib.py (python3-websockets, h1).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/ws/wsclient.py"
local LIB = server.root .. "/spec/ws/wslib.py"

local APP = [[
local k = require "khamsin"
local function echo(ws, data, binary) ws:send(data, binary) end
k.websocket("/ws", { message = echo })
k.websocket("/closer", { open = function(ws) ws:close(4000, "bye") end, message = echo })
k.websocket("/origin", { origin = "https://good.example", message = echo })
k.websocket("/proto", { protocols = { "chat.v2", "chat.v1" },
    message = function(ws, data) ws:send(tostring(ws.protocol) .. ":" .. data) end })
k.websocket("/info", { message = function(ws, data)
    if data == "id" then ws:send(ws.id) elseif data == "ping" then ws:ping("srv")
    elseif data == "n" then ws.n = (ws.n or 0) + 1; ws:send(tostring(ws.n)) -- a field the app sets
    elseif data == "req" then -- ws.req after open: the held (h1: compact) stream's path
        ws:send(tostring(ws.req.path) .. " " .. tostring(pcall(function() ws.id = 1 end)))
    end
end })
k.websocket("/slow", { message = function(ws, data)
    k.sleep(0.002 * (#data % 3)) -- handlers that wait: the next message waits for this one
    ws:send(data)
end })
k.websocket("/err", { message = function(ws, data)
    if data == "boom" then error("handler boom") end
    ws:send(data)
end })
k.get("/plain", function() return "plain" end)
]]

local function run_cases(srv, mode, cases, path)
    for _, c in ipairs(cases) do
        c.path = c.path or path or "/ws"
        c.timeout = c.timeout or 20
    end
    local inp = os.tmpname()
    server.write_file(inp, cjson.encode(cases))
    local p = assert(io.popen(PY .. " " .. CLIENT .. " " .. srv.port .. " " .. mode .. " < " .. inp, "r"))
    local out = p:read("*a")
    p:close()
    os.remove(inp)
    local ok, res = pcall(cjson.decode, out)
    assert(ok, "client output: " .. out)
    return res
end

-- "T:Hello P:x C:1000": what the server sent, one word per frame
local function summary(r)
    local w = {}
    for _, f in ipairs(r.frames or {}) do
        assert.is_false(f.masked) -- §5.1: a server never masks
        local tag
        if f.op == 1 then tag = "T" elseif f.op == 2 then tag = "B" elseif f.op == 10 then tag = "P"
        elseif f.op == 9 then tag = "I" elseif f.op == 0 then tag = "0" end
        if f.op == 8 then
            w[#w + 1] = "C:" .. tostring(r.close_code)
        elseif f.len > 64 or f.text == nil or f.op == 2 then
            w[#w + 1] = tag .. "#" .. f.len
        else
            w[#w + 1] = tag .. ":" .. f.text
        end
        if f.rsv ~= 0 and f.rsv ~= 4 then w[#w] = w[#w] .. "!rsv" .. f.rsv end
    end
    return table.concat(w, " ")
end

local function F(op, text, t)
    t = t or {}
    t.op, t.text = op, text
    return t
end
local function X(op, hex, t)
    t = t or {}
    t.op, t.hex = op, hex
    return t
end
local CLOSE = X(8, "03e8")

-- name, frames (or case table), expected summary
local CASES = {
    -- 1.x framing: text and binary echo at the length boundaries
    { "text empty", { F(1, ""), CLOSE }, "T: C:1000" },
    { "text 125", { F(1, "a", { ["repeat"] = 125 }), CLOSE }, "T#125 C:1000" },
    { "text 126", { F(1, "a", { ["repeat"] = 126 }), CLOSE }, "T#126 C:1000" },
    { "text 65535", { F(1, "a", { ["repeat"] = 65535 }), CLOSE }, "T#65535 C:1000" },
    { "text 65536", { F(1, "a", { ["repeat"] = 65536 }), CLOSE }, "T#65536 C:1000" },
    { "binary 3", { X(2, "00ff10"), CLOSE }, "B#3 C:1000" },
    { "binary 70000", { X(2, "ab", { ["repeat"] = 70000 }), CLOSE }, "B#70000 C:1000" },
    { "text in 1-byte writes", { frames = { F(1, "Hello"), CLOSE }, chunk = 1 }, "T:Hello C:1000" },
    -- 2.x pings and pongs
    { "ping", { F(9, "hi"), CLOSE }, "P:hi C:1000" },
    { "ping empty", { F(9, ""), CLOSE }, "P: C:1000" },
    { "ping 125", { F(9, "p", { ["repeat"] = 125 }), CLOSE }, "P#125 C:1000" },
    { "ping 126", { F(9, "p", { ["repeat"] = 126 }) }, "C:1002" },
    { "unsolicited pong", { F(10, "x"), F(1, "after"), CLOSE }, "T:after C:1000" },
    { "ten pings", { F(9, "1"), F(9, "2"), F(9, "3"), F(9, "4"), F(9, "5"), F(9, "6"), F(9, "7"),
        F(9, "8"), F(9, "9"), F(9, "10"), CLOSE }, "P:1 P:2 P:3 P:4 P:5 P:6 P:7 P:8 P:9 P:10 C:1000" },
    { "ping in 1-byte writes", { frames = { F(9, "slow"), CLOSE }, chunk = 1 }, "P:slow C:1000" },
    -- 3.x reserved bits
    { "rsv 1 (no extension)", { F(1, "x", { rsv = 4 }) }, "C:1002" },
    { "rsv 2", { F(1, "x", { rsv = 2 }) }, "C:1002" },
    { "rsv 3 after echo", { F(1, "ok"), F(1, "x", { rsv = 3 }) }, "T:ok C:1002" },
    { "rsv 4 on ping", { F(9, "x", { rsv = 1 }) }, "C:1002" },
    { "rsv 7 binary", { X(2, "00", { rsv = 7 }) }, "C:1002" },
    -- 4.x opcodes
    { "opcode 3", { X(3, "") }, "C:1002" },
    { "opcode 7 after echo", { F(1, "ok"), X(7, "00") }, "T:ok C:1002" },
    { "opcode 11", { X(11, "") }, "C:1002" },
    { "opcode 15 after ping", { F(9, "a"), X(15, "00") }, "P:a C:1002" },
    -- 5.x fragmentation
    { "two fragments", { F(1, "frag", { fin = false }), F(0, "ment") , CLOSE }, "T:fragment C:1000" },
    { "fragments + ping between", { F(1, "a", { fin = false }), F(9, "p"), F(0, "b", { fin = false }),
        F(0, "c"), CLOSE }, "P:p T:abc C:1000" },
    { "fragmented ping", { F(9, "a", { fin = false }), F(0, "b") }, "C:1002" },
    { "fragmented pong", { F(10, "a", { fin = false }), F(0, "b") }, "C:1002" },
    { "continuation first", { F(0, "x") }, "C:1002" },
    { "text inside a message", { F(1, "a", { fin = false }), F(1, "b") }, "C:1002" },
    { "empty fragments", { F(1, "", { fin = false }), F(0, "", { fin = false }), F(0, ""), CLOSE }, "T: C:1000" },
    { "binary fragments byte by byte", { frames = { X(2, "01", { fin = false }), X(0, "02"), CLOSE }, chunk = 1 },
        "B#2 C:1000" },
    -- 6.x UTF-8
    { "kosme", { X(1, "cebae1bdb9cf83cebcceb5"), CLOSE }, "T:\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5 C:1000" },
    { "kosme split in characters", { X(1, "ceba", { fin = false }), X(0, "e1", { fin = false }),
        X(0, "bd", { fin = false }), X(0, "b9cf83cebcceb5"), CLOSE }, "T:\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5 C:1000" },
    { "U+10FFFF", { X(1, "f48fbfbf"), CLOSE }, "T:\xf4\x8f\xbf\xbf C:1000" },
    { "U+110000", { X(1, "f4908080") }, "C:1007" },
    { "surrogate", { X(1, "eda080") }, "C:1007" },
    { "overlong", { X(1, "c0af") }, "C:1007" },
    { "truncated at the end", { X(1, "e282") }, "C:1007" },
    { "invalid across fragments", { X(1, "ce", { fin = false }), X(0, "41") }, "C:1007" },
    -- fail fast: the first fragment is already invalid; the rest never comes
    { "fail fast", { X(1, "41c0af", { fin = false }) }, "C:1007" },
    { "invalid after valid fragments", { X(1, "41", { fin = false }), X(0, "ff", { fin = false }) }, "C:1007" },
    { "binary need not be UTF-8", { X(2, "ff"), CLOSE }, "B#1 C:1000" },
    -- 7.x close
    { "close 1000", { X(8, "03e8") }, "C:1000" },
    { "close with reason", { X(8, "03e8" .. ("626965")) }, "C:1000" },
    { "close empty", { X(8, "") }, "C:1005" },
    { "close 1 byte", { X(8, "03") }, "C:1002" },
    { "close reason bad UTF-8", { X(8, "03e8ff") }, "C:1007" },
    { "data after close is ignored", { X(8, "03e8"), F(1, "late") }, "C:1000" },
    { "close after a fragment", { F(1, "a", { fin = false }), X(8, "03e8") }, "C:1000" },
    { "close 126 bytes", { X(8, "03e8" .. string.rep("61", 124)) }, "C:1002" },
    -- client frames must be masked (§5.1)
    { "unmasked frame", { F(1, "x", { mask = false }) }, "C:1002" },
}

local VALID_CODES = { 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999 }
local INVALID_CODES = { 0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535 }
for _, code in ipairs(VALID_CODES) do
    CASES[#CASES + 1] = { "close code " .. code, { X(8, string.format("%04x", code)) }, "C:" .. code }
end
for _, code in ipairs(INVALID_CODES) do
    CASES[#CASES + 1] = { "invalid close code " .. code, { X(8, string.format("%04x", code)) }, "C:1002" }
end

local function each_mode(fn)
    for _, mode in ipairs { "h1", "h2" } do
        describe("over " .. mode, function() fn(mode) end)
    end
end

describe("k.websocket conformance", function()
    local srv
    setup(function() srv = server.start { app = APP, workers = 1, expect_errors = { "handler boom" } } end)
    teardown(function() if srv then srv:stop() end end)

    each_mode(function(mode)
        it("runs message handlers one at a time, in order, even when they wait", function()
            local frames, want = {}, {}
            for i = 1, 60 do
                frames[#frames + 1] = F(1, tostring(i))
                want[#want + 1] = "T:" .. i
            end
            frames[#frames + 1] = CLOSE
            want[#want + 1] = "C:1000"
            local res = run_cases(srv, mode, { { frames = frames, path = "/slow" },
                { frames = frames, path = "/slow", chunk = 7 } })
            assert.are.equal(table.concat(want, " "), summary(res[1]))
            assert.are.equal(table.concat(want, " "), summary(res[2]))
        end)

        it("logs an error in a message handler and goes on with the next message", function()
            local res = run_cases(srv, mode, { { frames = { F(1, "a"), F(1, "boom"), F(1, "b"), CLOSE },
                path = "/err" } })
            assert.are.equal("T:a T:b C:1000", summary(res[1]))
            assert.truthy(srv:log():find("handler boom", 1, true))
        end)

        it("answers each case of the Autobahn families exactly", function()
            local batch = {}
            for i, c in ipairs(CASES) do
                local case = c[2].frames and c[2] or { frames = c[2] }
                batch[i] = case
            end
            local res = run_cases(srv, mode, batch)
            local bad = {}
            for i, c in ipairs(CASES) do
                local r = res[i]
                local got = r and (r.error or summary(r)) or "(no result)"
                if got ~= c[3] then bad[#bad + 1] = c[1] .. ": got '" .. got .. "', want '" .. c[3] .. "'" end
                if r and not r.error then
                    if mode == "h1" then
                        if not r.accept_ok then bad[#bad + 1] = c[1] .. ": Sec-WebSocket-Accept wrong" end
                        assert.are.equal(101, r.status)
                    else
                        assert.are.equal(200, r.status)
                        assert.is_true(r.connect_protocol)
                        -- wsproto read the same bytes: same close code
                        if r.wsproto_error then
                            bad[#bad + 1] = c[1] .. ": wsproto: " .. r.wsproto_error
                        elseif r.close_code ~= 1005 and r.wsproto_close_code ~= r.close_code then
                            bad[#bad + 1] = c[1] .. ": wsproto read close " .. tostring(r.wsproto_close_code)
                        end
                    end
                    -- after a close frame the server ends the connection (h1) / stream (h2)
                    if r.close_code and not r.eof then bad[#bad + 1] = c[1] .. ": no end after close" end
                end
            end
            assert.are.same({}, bad)
        end)

        it("refuses a bad handshake: version, key, origin", function()
            local res = run_cases(srv, mode, {
                { frames = { CLOSE }, headers = { ["Sec-WebSocket-Version"] = "8" } },
                { frames = { CLOSE }, headers = { ["Origin"] = "https://evil.example" }, path = "/origin" },
                { frames = { F(1, "o"), CLOSE }, headers = { ["Origin"] = "https://good.example" }, path = "/origin" },
            })
            assert.are.equal(426, res[1].status)
            assert.are.equal("13", res[1].headers["sec-websocket-version"])
            assert.are.equal(403, res[2].status)
            assert.are.equal("T:o C:1000", summary(res[3]))
            if mode == "h1" then
                local r = run_cases(srv, mode, {
                    { frames = { CLOSE }, headers = { ["Sec-WebSocket-Key"] = "short" } },
                    { frames = { CLOSE }, headers = { ["Sec-WebSocket-Key"] = false } },
                })
                assert.are.equal(400, r[1].status)
            end
        end)

        it("closes from the server side with ws:close(code, reason)", function()
            local res = run_cases(srv, mode, { { frames = { X(8, "0fa0") }, path = "/closer" } })
            assert.are.equal("C:4000", summary(res[1]))
            assert.are.equal("0fa0627965", res[1].frames[1].hex) -- code 4000, reason "bye"
            assert.is_true(res[1].eof)
        end)

        it("picks a subprotocol the client offered, and pings from the server", function()
            local res = run_cases(srv, mode, {
                { frames = { F(1, "x"), CLOSE }, path = "/proto",
                  headers = { ["Sec-WebSocket-Protocol"] = "chat.v0, chat.v1" } },
                { frames = { F(1, "ping"), F(1, "id"), CLOSE }, path = "/info" },
                { frames = { F(1, "n"), F(1, "req"), F(1, "n"), CLOSE }, path = "/info" },
            })
            assert.are.equal("chat.v1", res[1].headers["sec-websocket-protocol"])
            assert.are.equal("T:chat.v1:x C:1000", summary(res[1]))
            local s = summary(res[2])
            assert.truthy(s:match("^I:srv T:%d+%-%d+%-%d+ C:1000$"), s)
            -- the ws object is a userdata: fields the app sets stay; id cannot be set
            assert.are.equal("T:1 T:/info false T:2 C:1000", summary(res[3]))
        end)

        it("negotiates permessage-deflate and echoes compressed messages", function()
            local big = string.rep("compress me, ", 8000) -- 104000 bytes
            local res = run_cases(srv, mode, {
                { deflate = true, frames = { F(1, "Hello", { deflate = true }), F(1, "plain"), CLOSE } },
                { deflate = true, frames = { F(1, big, { deflate = true }), CLOSE } },
                { deflate = true, frames = { F(1, "abcd", { deflate = true, split = 3 }), CLOSE } },
                { deflate = true, offer = "permessage-deflate; server_max_window_bits=10",
                  frames = { F(1, "win10", { deflate = true }), CLOSE } },
                { deflate = true, offer = "permessage-deflate; server_max_window_bits=8", frames = { F(1, "x"), CLOSE } },
                { deflate = true, frames = { F(9, "p", { deflate = true }) } },
            })
            local ext = res[1].headers["sec-websocket-extensions"]
            assert.are.equal("permessage-deflate; server_no_context_takeover; client_no_context_takeover", ext)
            assert.are.equal("T:Hello T:plain C:1000", summary(res[1]))
            for _, f in ipairs(res[1].frames) do
                if f.op == 1 then assert.are.equal(4, f.rsv) end -- the server compresses too
            end
            assert.are.equal("T#104000 C:1000", summary(res[2]))
            assert.are.equal("T:abcd C:1000", summary(res[3]))
            assert.truthy(res[4].headers["sec-websocket-extensions"]:find("server_max_window_bits=10", 1, true))
            assert.are.equal("T:win10 C:1000", summary(res[4]))
            assert.is_nil(res[5].headers["sec-websocket-extensions"]) -- declined: zlib has no 8-bit window
            assert.are.equal("T:x C:1000", summary(res[5]))
            assert.are.equal("C:1002", summary(res[6])) -- RSV1 on a control frame
        end)
    end)
end)

describe("k.websocket limits", function()
    local srv
    setup(function()
        srv = server.start { app = APP, workers = 1,
            args = { "--ws-message-bytes", "1000", "--ws-frame-bytes", "600" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    each_mode(function(mode)
        it("closes 1009 past ws_frame_bytes, ws_message_bytes and the inflated size", function()
            local res = run_cases(srv, mode, {
                { frames = { F(1, "a", { ["repeat"] = 600 }), CLOSE } },
                { frames = { F(1, "a", { ["repeat"] = 601 }) } },
                { frames = { F(1, "a", { ["repeat"] = 500, fin = false }), F(0, "b", { ["repeat"] = 500 }), CLOSE } },
                { frames = { F(1, "a", { ["repeat"] = 500, fin = false }), F(0, "b", { ["repeat"] = 501 }) } },
                -- 5000 bytes deflate to a few dozen: the limit is on what they inflate to
                { deflate = true, frames = { F(1, "z", { ["repeat"] = 5000, deflate = true }) } },
            })
            assert.are.equal("T#600 C:1000", summary(res[1]))
            assert.are.equal("C:1009", summary(res[2]))
            assert.are.equal("T#1000 C:1000", summary(res[3]))
            assert.are.equal("C:1009", summary(res[4]))
            assert.are.equal("C:1009", summary(res[5]))
        end)
    end)
end)

describe("k.websocket with python3-websockets (h1)", function()
    local srv
    setup(function() srv = server.start { app = APP, workers = 1 } end)
    teardown(function() if srv then srv:stop() end end)

    it("echoes text and binary, compressed, and answers its ping", function()
        local p = assert(io.popen(PY .. " " .. LIB .. " " .. srv.port, "r"))
        local out = p:read("*a")
        p:close()
        local ok, r = pcall(cjson.decode, out)
        assert(ok, out)
        assert.are.same({ text = true, binary = true, big = true, ping = true,
            extensions = "permessage-deflate", close_code = 1000 }, r)
    end)
end)

local PUSH = server.root .. "/spec/ws/pushclient.py"

local PUSH_APP = [[
local k = require "khamsin"
k.websocket("/info", { message = function(ws, data) if data == "id" then ws:send(ws.id) end end })
k.websocket("/room", { open = function(ws) ws:subscribe("room") end })
k.get("/send", function(req)
    local ok, err = k.send_to(req.args.id, req.args.data)
    return (ok and "sent" or ("not sent: " .. tostring(err))) .. " by worker " .. k.worker_id()
end)
k.get("/later", function(req)
    local id = req.args.id
    k.timer(0.05, function() k.send_to(id, "from a timer") end)
    return "later"
end)
k.get("/publish", function(req)
    local msg = string.rep("x", tonumber(req.args.size))
    -- two messages per loop turn: a socket that reads keeps up (its queue drains between
    -- turns), the one that does not passes stream_out_cap
    for i = 1, tonumber(req.args.count) do
        k.publish("room", msg)
        if i % 2 == 0 then k.sleep(0.02) end
    end
    return "published"
end)
]]

describe("k.send_to and k.publish to WebSockets", function()
    local srv
    setup(function()
        srv = server.start { app = PUSH_APP, workers = 2 }
    end)
    teardown(function() if srv then srv:stop() end end)

    local function py(args)
        local p = assert(io.popen(PY .. " " .. PUSH .. " " .. srv.port .. " " .. args, "r"))
        local out = p:read("*a")
        p:close()
        local ok, r = pcall(cjson.decode, out)
        assert(ok, out)
        return r
    end

    it("k.send_to(ws.id) reaches the socket from requests on either worker and from a timer", function()
        local r = py("sendto 12")
        local want = {}
        for i = 0, 11 do want[#want + 1] = "m" .. i end
        want[#want + 1] = "from a timer"
        assert.are.same(want, r.got)
        local workers = {}
        for i = 1, 12 do
            assert.truthy(r.http[i]:match("^sent by worker %d$"), r.http[i])
            workers[r.http[i]] = true
        end
        assert.truthy(r.id:match("^%d+%-%d+%-%d+$"))
    end)

    it("k.publish reaches every subscribed socket; a slow one is closed 1008 and stalls no one", function()
        -- 400 messages of 16 KiB (6.4 MB) to each socket, 32 KiB per 20 ms: past stream_out_cap
        -- (1 MiB) plus what the kernel buffers (~3 MB) for the socket that does not read
        local r = py("broadcast 6 400 16384")
        assert.are.same({ 400, 400, 400, 400, 400, 400 }, r.fast)
        assert.are.equal(1008, r.slow_close)
        assert.is_true(r.slow_messages < 400)
    end)
end)
