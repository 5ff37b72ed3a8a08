-- spec/h3_conformance_spec.lua: bad input over HTTP/3 (issue 12 item 6). Malformed QUIC
-- datagrams (garbage, a truncated Initial, an Initial under 1200 bytes, an unknown version) are
-- dropped or answered with a Version Negotiation and never disturb another connection; invalid
-- HTTP/3 frames and QPACK errors end the connection with the error code RFC 9114 / RFC 9204
-- name. The bad bytes go through kh-h3get's raw mode (--raw-uni / --raw-bidi / --no-h3), a
-- Python UDP socket sends the bad datagrams; each time a good request runs alongside and must
-- complete.
local server = require "helpers.server"
local h3 = require "helpers.h3"

local sh_quote = server.sh_quote

local APP = [[
local k = require "khamsin"
k.get("/", function(req) return "Hello, World!" end)
k.get("/slow", function(req)
    k.sleep(tonumber(req.args.s or "1"))
    return "slept"
end)
]]

local h3get_bin = h3.h3get_bin
local run = h3.run
local function quic_port(srv) return h3.quic_port(srv, 15) end

local srv, port

-- A good request in the background (its handler sleeps s seconds); returns a function that
-- waits for it and asserts it got its 200.
local function good_request(s)
    local outf = os.tmpname()
    os.execute(string.format("(%s -w -o /dev/null --timeout 20 %s >%s 2>&1; echo rc=$? >>%s) &",
        sh_quote(h3get_bin()), sh_quote(string.format("https://127.0.0.1:%d/slow?s=%s", port, s)),
        sh_quote(outf), sh_quote(outf)))
    return function()
        local out = server.wait_until(30, function()
            local t = server.read_file(outf)
            return t and t:find("rc=") and t
        end)
        os.remove(outf)
        assert.truthy(out, "the good request finished")
        assert.truthy(out:find("status=200", 1, true), out)
        assert.truthy(out:find("rc=0", 1, true), out)
    end
end

local function raw(args)
    local parts = { "timeout 30", sh_quote(h3get_bin()), "--timeout", "10" }
    for _, a in ipairs(args) do parts[#parts + 1] = sh_quote(a) end
    parts[#parts + 1] = sh_quote(string.format("https://127.0.0.1:%d/", port))
    return run(table.concat(parts, " "))
end

local function closes_with(code, args)
    local done = good_request("0.3")
    local out, rc = raw(args)
    assert.are.equal(0, rc, out)
    assert.truthy(out:find(string.format("the server closed the connection (application 0x%x)", code), 1, true),
        out)
    done()
end

describe("HTTP/3 conformance: bad input", function()
    setup(function()
        srv = server.start { app = APP, tls = true, start_timeout = 20,
            args = { "--http3", "--log-level", "debug" } }
        port = quic_port(srv)
    end)

    teardown(function()
        if srv then srv:stop() end
    end)

    it("drops malformed datagrams, answers an unknown version with Version Negotiation", function()
        local done = good_request("1")
        local script = string.format([=[
import os, socket, struct
port = %d
def sock():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    return s
def silent(s, t=0.4):
    s.settimeout(t)
    try:
        s.recv(2048)
        return False
    except socket.timeout:
        return True
def initial(total, length=None, version=1):
    dcid, scid = os.urandom(8), os.urandom(8)
    head = bytes([0xc3]) + struct.pack(">I", version) + bytes([8]) + dcid + bytes([8]) + scid + b"\x00"
    body_len = total - len(head) - 2
    n = body_len if length is None else length
    return head + struct.pack(">H", 0x4000 | n) + os.urandom(body_len), dcid, scid
# garbage: short headers whose DCID names no worker (no stateless reset), random long headers
s = sock()
for i in range(40):
    g = bytearray(os.urandom(1 + i * 30))
    g[0] = (g[0] & 0x3f) | 0x40
    if len(g) > 1:
        g[1] = 0xff
    s.send(bytes(g))
for i in range(10):
    s.send(bytes([0x80 | (i & 0x3f)]) + os.urandom(20 + i))
print("garbage", "silent" if silent(s) else "answered")
# a truncated Initial: its length field says 1180 bytes, 100 came
s = sock()
pkt, _, _ = initial(100, length=1180)
s.send(pkt)
print("truncated", "silent" if silent(s) else "answered")
# an Initial under 1200 bytes (RFC 9000 §14.1): dropped
s = sock()
pkt, _, _ = initial(1000)
s.send(pkt)
print("short", "silent" if silent(s) else "answered")
# a well-formed 1200-byte Initial whose payload does not decrypt
s = sock()
pkt, _, _ = initial(1200)
s.send(pkt)
print("undecryptable", "silent" if silent(s) else "answered")
# an unknown version, 1200 bytes: Version Negotiation, our CIDs swapped, version 1 offered
s = sock()
pkt, dcid, scid = initial(1200, version=0x1a2a3a4a)
s.send(pkt)
s.settimeout(3)
vn = s.recv(2048)
ver = struct.unpack(">I", vn[1:5])[0]
dl = vn[5]; d = vn[6:6 + dl]; sl = vn[6 + dl]; sc = vn[7 + dl:7 + dl + sl]
vers = [struct.unpack(">I", vn[i:i + 4])[0] for i in range(7 + dl + sl, len(vn), 4)]
print("vn", ver, d == scid, sc == dcid, 1 in vers)
# the same under 1200 bytes: nothing
s = sock()
pkt, _, _ = initial(600, version=0x1a2a3a4a)
s.send(pkt)
print("short-vn", "silent" if silent(s) else "answered")
]=], port)
        local out, rc = run("/usr/bin/python3 -c " .. sh_quote(script))
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("garbage silent", 1, true), out)
        assert.truthy(out:find("truncated silent", 1, true), out)
        assert.truthy(out:find("short silent", 1, true), out)
        assert.truthy(out:find("undecryptable silent", 1, true), out)
        assert.truthy(out:find("vn 0 True True True", 1, true), out)
        assert.truthy(out:find("short-vn silent", 1, true), out)
        done()
        -- the undecryptable Initial made a connection that went at once, not at its timeout
        assert.truthy(srv:wait_log("quic: dropped: a first packet that did not decrypt", 5), srv:log())
        local out2, rc2 = run(string.format("%s -w -o /dev/null https://127.0.0.1:%d/",
            sh_quote(h3get_bin()), port))
        assert.are.equal(0, rc2, out2)
        assert.truthy(out2:find("status=200", 1, true), out2)
    end)

    it("DATA before HEADERS on a request stream: H3_FRAME_UNEXPECTED", function()
        closes_with(0x105, { "--raw-bidi", "00 02 61 62" })
    end)

    it("a reserved HTTP/2 frame type on a request stream: H3_FRAME_UNEXPECTED", function()
        closes_with(0x105, { "--raw-bidi", "02 01 00" })
    end)

    it("DATA on the control stream: H3_FRAME_UNEXPECTED", function()
        closes_with(0x105, { "--no-h3", "--raw-uni", "00 04 00 00 01 61" })
    end)

    it("a second control stream: H3_STREAM_CREATION_ERROR", function()
        closes_with(0x103, { "--no-h3", "--raw-uni", "00 04 00", "--raw-uni", "00 04 00" })
    end)

    it("a control stream that does not start with SETTINGS: H3_MISSING_SETTINGS", function()
        closes_with(0x10a, { "--no-h3", "--raw-uni", "00 07 01 00" })
    end)

    it("a truncated SETTINGS frame (an identifier without its value): H3_FRAME_ERROR", function()
        closes_with(0x106, { "--no-h3", "--raw-uni", "00 04 01 01" })
    end)

    it("SETTINGS_ENABLE_CONNECT_PROTOCOL other than 0 or 1: H3_SETTINGS_ERROR", function()
        closes_with(0x109, { "--no-h3", "--raw-uni", "00 04 02 08 02" })
    end)

    it("SETTINGS with an HTTP/2 setting: H3_SETTINGS_ERROR", function()
        closes_with(0x109, { "--no-h3", "--raw-uni", "00 04 02 02 00" })
    end)

    it("a QPACK encoder instruction past the table's capacity: QPACK_ENCODER_STREAM_ERROR", function()
        -- Set Dynamic Table Capacity 5000, over the 0 the server allows
        closes_with(0x201, { "--no-h3", "--raw-uni", "00 04 00", "--raw-uni", "02 3f e9 26" })
    end)

    it("a request without :scheme and :path: the stream is reset with H3_MESSAGE_ERROR", function()
        local done = good_request("0.3")
        -- HEADERS holding only ":method: GET" (QPACK static index 17)
        local out, rc = raw({ "--raw-bidi", "01 03 00 00 d1" })
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("raw: reset stream 0 0x10e", 1, true), out)
        done()
    end)

    it("a second QPACK decoder stream: H3_STREAM_CREATION_ERROR", function()
        closes_with(0x103, { "--no-h3", "--raw-uni", "00 04 00", "--raw-uni", "03", "--raw-uni", "03" })
    end)

    it("a field line naming a dynamic entry that does not exist: QPACK_DECOMPRESSION_FAILED", function()
        -- Required Insert Count 0, then an indexed field line, dynamic, relative index 0
        closes_with(0x200, { "--no-h3", "--raw-uni", "00 04 00", "--raw-bidi", "01 03 00 00 80" })
    end)
end)
