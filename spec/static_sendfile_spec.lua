-- k.static's large files: sendfile(2) on h1 cleartext (kh_stream_send_file -> kh_conn_sendfile),
-- 64 KiB reads on TLS and h2. The bytes (sha256) of a multi-MiB file and of a range over h1,
-- h1+tls, h2c and h2; a response queued after a sendfile body on the same connection (pipelined)
-- leaves after it; a reader that stops reading a sendfile body is cut by write_timeout_ms and
-- its file and socket descriptors are closed.
local server = require "helpers.server"

local MB = 1024 * 1024
local SIZE = 3 * MB + 123

local APP = [[
local k = require "khamsin"
k.static("/s", os.getenv("KH_STATIC_ROOT"))
]]

local function sha256(path)
    local p = io.popen("sha256sum " .. server.sh_quote(path))
    local out = p:read("*a")
    p:close()
    return out:match("^(%x+)")
end

local function sha256_of(data, dir, name)
    local path = dir .. "/" .. name
    server.write_file(path, data)
    return sha256(path)
end

local function fds(pid)
    local p = io.popen("ls /proc/" .. pid .. "/fd | wc -l")
    local n = tonumber(p:read("*a"))
    p:close()
    return n
end

describe("k.static large files (sendfile on h1 cleartext)", function()
    local srv, base, root, data, want
    setup(function()
        base = os.tmpname()
        os.remove(base)
        root = base .. "/root"
        assert(os.execute("mkdir -p " .. root))
        assert(os.execute("head -c " .. SIZE .. " /dev/urandom > " .. root .. "/big.bin"))
        -- sparse: 64 MiB the slow reader's socket buffers cannot hold
        assert(os.execute("truncate -s 64M " .. root .. "/huge.bin"))
        server.write_file(root .. "/small.txt", "small file\n")
        data = assert(server.read_file(root .. "/big.bin"))
        assert.are.equal(SIZE, #data)
        want = sha256(root .. "/big.bin")
        srv = server.start { app = APP, workers = 1, http3 = false,
            args = { "--limit", "write_timeout_ms=500" }, env = { KH_STATIC_ROOT = root } }
    end)
    teardown(function()
        if srv then srv:stop() end
        if base then os.execute("rm -rf " .. base) end
    end)

    for _, proto in ipairs { "h1", "h1+tls", "h2c", "h2" } do
        it("serves a 3 MiB file and a range of it, bytes intact (" .. proto .. ")", function()
            local r = srv:request { path = "/s/big.bin", proto = proto, timeout = 30 }
            assert.are.equal(200, r.status)
            assert.are.equal(tostring(SIZE), r.headers["content-length"])
            assert.are.equal(SIZE, #r.body)
            assert.are.equal(want, sha256_of(r.body, srv.dir, "got-" .. proto))
            local a, b = 1000001, 3000002 -- spans many socket writes and 64 KiB reads
            r = srv:request { path = "/s/big.bin", proto = proto, timeout = 30,
                headers = { Range = "bytes=" .. a .. "-" .. b } }
            assert.are.equal(206, r.status)
            assert.are.equal(string.format("bytes %d-%d/%d", a, b, SIZE), r.headers["content-range"])
            assert.are.equal(b - a + 1, #r.body)
            assert.are.equal(sha256_of(data:sub(a + 1, b + 1), srv.dir, "want-range"),
                sha256_of(r.body, srv.dir, "got-range-" .. proto))
            r = srv:request { path = "/s/big.bin", proto = proto, method = "HEAD" }
            assert.are.equal(200, r.status)
            assert.are.equal(tostring(SIZE), r.headers["content-length"])
            assert.are.equal("", r.body)
        end)
    end

    it("sends what follows a sendfile body after it (pipelined, h1)", function()
        local c = assert(srv:raw_conn())
        c:send("GET /s/big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=5-200004\r\n\r\n"
            .. "GET /s/small.txt HTTP/1.1\r\nHost: x\r\n\r\n"
            .. "GET /s/big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=-7\r\n\r\n"
            .. "GET /s/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        local got = c:read_until_close(20)
        c:close()
        local rs = server.parse_responses(got)
        assert.are.equal(4, #rs, #got .. " bytes")
        assert.are.equal(206, rs[1].status)
        assert.is_true(rs[1].body == data:sub(6, 200005), "first range differs")
        assert.are.equal(200, rs[2].status)
        assert.are.equal("small file\n", rs[2].body)
        assert.are.equal(206, rs[3].status)
        assert.are.equal(data:sub(-7), rs[3].body)
        assert.are.equal(404, rs[4].status)
    end)

    it("cuts a reader that stops reading a sendfile body after write_timeout_ms, fds closed", function()
        assert.are.equal(200, srv:request { path = "/s/small.txt" }.status)
        local before = fds(srv.pid)
        local c = assert(srv:raw_conn { rcvbuf = 4096 })
        c:send("GET /s/huge.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.truthy(server.wait_until(20, function() return #c.buf > 0 or c:fill(0.1) ~= "" end))
        server.sleep(1) -- read nothing: the socket fills, sendfile waits for it in vain
        local t0 = server.now()
        local got, closed = c:read_until_close(10)
        local why = string.format("%d bytes read in %.2f s after the stall, close: %s", #got,
            server.now() - t0, tostring(c.close_reason))
        c:close()
        assert.is_true(closed, "connection still open: " .. why)
        assert.truthy(#got < 64 * MB, "the whole 64 MiB body arrived: no write timeout; " .. why)
        assert.truthy(server.wait_until(10, function() return fds(srv.pid) <= before end, 0.1),
            "fds before " .. before .. ", now " .. fds(srv.pid))
        local r = srv:request { path = "/s/big.bin", headers = { Range = "bytes=0-9" } }
        assert.are.equal(data:sub(1, 10), r.body)
    end)
end)
