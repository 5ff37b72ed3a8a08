-- spec/h3_spec.lua: HTTP/3 with --http3 (khamsin-h3.so: QUIC on ngtcp2 0.12 + GnuTLS, HTTP/3 on
-- nghttp3 0.8): each TLS listener also listens on UDP on its port and says so in the log, TCP
-- responses advertise it with Alt-Svc, requests reach the same handlers (our own client,
-- core/tools/kh_h3get.c, and ngtcp2's gtlsclient), QUIC connections count in the `connections`
-- limit and take part in the graceful stop, h3 applies the header/body/idle timeouts, and a
-- server without --http3 maps none of the QUIC libraries.
local server = require "helpers.server"
local h3 = require "helpers.h3"

local sh_quote = server.sh_quote

local APP = [[
local k = require "khamsin"
k.get("/", function(req) return "Hello, World!" end)
k.get("/users/:id", function(req)
    return { id = req.params.id, agent = req.headers["user-agent"], proto = req.headers["x-proto"] }
end)
k.post("/echo", function(req, res)
    res.headers["content-type"] = req.headers["content-type"] or "application/octet-stream"
    res.headers["x-method"] = req.method
    return 201, req:body()
end)
k.get("/slow", function(req)
    k.log.info("slow request started")
    k.sleep(tonumber(req.args.s or "1"))
    return "slept"
end)
k.get("/big", function(req) return string.rep("0123456789", 50000) end)
]]

local h3get_bin = h3.h3get_bin
local run = h3.run
local quic_port = h3.quic_port

-- kh-h3get with args (a list), against path on srv's QUIC port. Returns the head dump, the
-- body, stderr+stdout text and the exit code.
local function h3(srv, path, args)
    local dir = srv.dir
    local head, body = dir .. "/h3.head", dir .. "/h3.body"
    os.remove(head)
    os.remove(body)
    local parts = { sh_quote(h3get_bin()), "-D", sh_quote(head), "-o", sh_quote(body) }
    for _, a in ipairs(args or {}) do parts[#parts + 1] = sh_quote(a) end
    parts[#parts + 1] = sh_quote(string.format("https://127.0.0.1:%d%s", quic_port(srv), path))
    local out, rc = run(table.concat(parts, " "))
    return server.read_file(head) or "", server.read_file(body) or "", out, rc
end

local function status_of(head)
    return tonumber(head:match("^HTTP/3 (%d+)"))
end

local function header(head, name)
    return head:match("\n" .. name .. ": ([^\r\n]*)")
end

local function start(opts)
    opts = opts or {}
    local args = { "--http3" }
    for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
    return server.start { app = opts.app or APP, tls = true, args = args, workers = opts.workers,
        expect_errors = opts.expect_errors }
end

local function with(srv, fn)
    local ok, err = pcall(fn)
    srv:stop()
    assert(ok, err)
end

-- a 2.4 MB upload body in srv's directory (the migration specs): its path
local function upload_file(srv)
    local up = srv.dir .. "/up.bin"
    local f = assert(io.open(up, "wb"))
    f:write(string.rep("0123456789abcdef", 150000))
    f:close()
    return up
end

-- runs connections came to srv, each once: none was re-created on another worker
local function one_connection_per_run(srv, runs)
    local _, conns = srv:log():gsub("quic: new connection", "")
    assert.are.equal(runs, conns, "one connection per run, none re-created on another worker")
end

local function mapped(pid)
    local f = assert(io.open("/proc/" .. pid .. "/maps", "r"))
    local s = f:read("*a")
    f:close()
    return s
end

describe("HTTP/3 (--http3)", function()
    it("listens on UDP on the TLS listener's port and logs it as (quic)", function()
        local srv = start()
        with(srv, function()
            local tls = srv.tls_listens[1]
            assert.are.equal(tls.port, quic_port(srv), srv:log())
        end)
    end)

    it("answers a GET through our client with the same head as h1/h2", function()
        local srv = start()
        with(srv, function()
            local head, body, out, rc = h3(srv, "/")
            assert.are.equal(0, rc, out)
            assert.are.equal(200, status_of(head), head)
            assert.are.equal("Hello, World!", body)
            assert.are.equal("khamsin", header(head, "server"))
            assert.is_nil(header(head, "x%-request%-id"), head) -- only a client's own is echoed
            assert.truthy(header(head, "strict%-transport%-security"), head)
            assert.are.equal("13", header(head, "content%-length"))
            assert.truthy(server.is_http_date(header(head, "date")), head)
        end)
    end)

    it("passes method, request headers and a body to the handler (POST)", function()
        local srv = start()
        with(srv, function()
            local payload = string.rep("abcdefgh", 40000) -- 320 KB: flow control windows move
            local f = assert(io.open(srv.dir .. "/payload", "wb"))
            f:write(payload)
            f:close()
            local head, body, out, rc = h3(srv, "/echo",
                { "-H", "Content-Type: text/x-test", "-d", "@" .. srv.dir .. "/payload" })
            assert.are.equal(0, rc, out)
            assert.are.equal(201, status_of(head), head)
            assert.are.equal("text/x-test", header(head, "content%-type"))
            assert.are.equal("POST", header(head, "x%-method"))
            assert.are.equal(#payload, #body)
            assert.are.equal(payload, body)
            head, body, out, rc = h3(srv, "/users/42", { "-H", "User-Agent: h3-spec", "-H", "X-Proto: three" })
            assert.are.equal(0, rc, out)
            assert.are.equal(200, status_of(head), head)
            assert.truthy(body:find('"id":"42"', 1, true), body)
            assert.truthy(body:find('"agent":"h3-spec"', 1, true), body)
            assert.truthy(body:find('"proto":"three"', 1, true), body)
        end)
    end)

    it("sends a large response whose chunks are freed only once acknowledged", function()
        local srv = start()
        with(srv, function()
            local head, body, out, rc = h3(srv, "/big")
            assert.are.equal(0, rc, out)
            assert.are.equal(200, status_of(head), head)
            assert.are.equal(500000, #body)
            assert.are.equal(string.rep("0123456789", 50000), body)
        end)
    end)

    it("serves many requests on one connection, and many connections one after another", function()
        local srv = start()
        with(srv, function()
            -- more than h3_max_streams (100): closed streams make room for new ones
            local _, _, out, rc = h3(srv, "/", { "--repeat", "150", "-w" })
            assert.are.equal(0, rc, out)
            local n = select(2, out:gsub("status=200", ""))
            assert.are.equal(150, n, out)
            _, _, out, rc = h3(srv, "/", { "--connections", "30", "-w" })
            assert.are.equal(0, rc, out)
            assert.are.equal(30, select(2, out:gsub("status=200", "")), out)
        end)
    end)

    it("answers a 404 from the router and a HEAD without a body", function()
        local srv = start()
        with(srv, function()
            local head, body, out, rc = h3(srv, "/nope")
            assert.are.equal(0, rc, out)
            assert.are.equal(404, status_of(head), head)
            head, body, out, rc = h3(srv, "/", { "-X", "HEAD" })
            assert.are.equal(0, rc, out)
            assert.are.equal(200, status_of(head), head)
            assert.are.equal("", body)
        end)
    end)

    it("interoperates with ngtcp2's gtlsclient", function()
        local srv = start()
        with(srv, function()
            local port = quic_port(srv)
            local out, rc = run(string.format("timeout 20 gtlsclient --exit-on-all-streams-close " ..
                "127.0.0.1 %d https://127.0.0.1:%d/users/7", port, port))
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("[:status: 200]", 1, true), out)
            assert.truthy(out:find("content-type: application/json", 1, true), out)
        end)
    end)

    it("advertises h3 with Alt-Svc on TLS responses over h1 and h2, with the listener's port", function()
        local srv = start()
        with(srv, function()
            local port = quic_port(srv)
            for _, proto in ipairs { "--http1.1", "--http2" } do
                local out = run(string.format("curl -sk %s -D - -o /dev/null https://127.0.0.1:%d/",
                    proto, srv.tls_listens[1].port))
                assert.truthy(out:lower():find(string.format('alt-svc: h3=":%d"; ma=86400', port), 1, true), out)
            end
        end)
        -- without --http3: no Alt-Svc
        local plain = server.start { app = APP, tls = true }
        with(plain, function()
            local out = run(string.format("curl -sk -D - -o /dev/null https://127.0.0.1:%d/",
                plain.tls_listens[1].port))
            assert.truthy(out:find("HTTP/1.1 200", 1, true) or out:find("HTTP/2 200", 1, true), out)
            assert.falsy(out:lower():find("alt-svc", 1, true), out)
        end)
    end)

    it("maps ngtcp2, nghttp3 and GnuTLS only with --http3", function()
        local plain = server.start { app = APP, tls = true }
        with(plain, function()
            local out = run(string.format("curl -sk https://127.0.0.1:%d/", plain.tls_listens[1].port))
            assert.are.equal("Hello, World!", out)
            local maps = mapped(plain.pid)
            assert.truthy(maps:find("khamsin-tls.so", 1, true), "the TLS module is mapped")
            assert.falsy(maps:find("libngtcp2", 1, true))
            assert.falsy(maps:find("libnghttp3", 1, true))
            assert.falsy(maps:find("libgnutls", 1, true))
            assert.falsy(maps:find("khamsin-h3.so", 1, true))
        end)
        local srv = start()
        with(srv, function()
            local _, body, out, rc = h3(srv, "/")
            assert.are.equal(0, rc, out)
            assert.are.equal("Hello, World!", body)
            local maps = mapped(srv.pid)
            assert.truthy(maps:find("khamsin-h3.so", 1, true))
            assert.truthy(maps:find("libngtcp2", 1, true))
            assert.truthy(maps:find("libnghttp3", 1, true))
            assert.truthy(maps:find("libgnutls", 1, true))
        end)
    end)

    it("refuses --http3 without a TLS listener", function()
        local out, rc = run(sh_quote(server.bin()) .. " --http3 --listen 127.0.0.1:0 /dev/null")
        assert.are.equal(2, rc, out)
        assert.truthy(out:find("--http3 needs a TLS listener", 1, true), out)
    end)

    it("resets a request stream whose head does not complete within header_timeout_ms", function()
        local srv = start { args = { "--header-timeout-ms", "300" } }
        with(srv, function()
            local t0 = server.now()
            local _, _, out, rc = h3(srv, "/", { "--stall-headers" })
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("reset 0x10d", 1, true), out) -- H3_REQUEST_INCOMPLETE
            assert.truthy(server.now() - t0 < 5, "within the header timeout (and its tick)")
            -- the connection and the server go on
            local head, _, out2, rc2 = h3(srv, "/")
            assert.are.equal(0, rc2, out2)
            assert.are.equal(200, status_of(head), head)
        end)
    end)

    it("answers 408 when a request body stalls past body_timeout_ms", function()
        local srv = start { args = { "--body-timeout-ms", "300" } }
        with(srv, function()
            local head, _, out, rc = h3(srv, "/echo", { "-d", "partial", "--declare-length", "100" })
            assert.are.equal(0, rc, out)
            assert.are.equal(408, status_of(head), head)
        end)
    end)

    it("closes an idle connection after keepalive_timeout_ms", function()
        local srv = start { args = { "--keepalive-timeout-ms", "300", "--log-level", "debug" } }
        with(srv, function()
            local _, _, out, rc = h3(srv, "/", { "--linger", "3" })
            assert.are.equal(0, rc, out)
            assert.truthy(srv:wait_log("quic: idle timeout: closed", 5), srv:log())
        end)
    end)

    it("counts QUIC connections in the connections limit", function()
        local srv = start { args = { "--connections", "1", "--log-level", "debug" } }
        with(srv, function()
            -- one connection holds the only slot while its request sleeps
            local cmd = string.format("%s -o /dev/null https://127.0.0.1:%d/slow?s=3 >%s 2>&1 &",
                sh_quote(h3get_bin()), quic_port(srv), sh_quote(srv.dir .. "/first.out"))
            os.execute(cmd)
            assert.truthy(srv:wait_log("quic: new connection %(1 open", 10), srv:log())
            local _, _, out, rc = h3(srv, "/", { "--timeout", "1" })
            assert.are_not.equal(0, rc, "a second connection is not accepted at the limit: " .. out ..
                (server.read_file(srv.dir .. "/first.out") or ""))
            -- once the first one is gone, a new one is served
            assert.truthy(server.wait_until(15, function()
                local _, _, _, rc2 = h3(srv, "/", { "--timeout", "2" })
                return rc2 == 0
            end, 0.2))
        end)
    end)

    it("stops gracefully: the request in flight completes, then CONNECTION_CLOSE", function()
        local srv = start()
        local port = quic_port(srv)
        local outf = srv.dir .. "/graceful.out"
        local cmd = string.format("(%s -w -D %s -o %s --linger 5 https://127.0.0.1:%d/slow?s=1 >%s 2>&1; echo rc=$? >>%s) &",
            sh_quote(h3get_bin()), sh_quote(srv.dir .. "/g.head"), sh_quote(srv.dir .. "/g.body"),
            port, sh_quote(outf), sh_quote(outf))
        os.execute(cmd)
        -- the request is in its handler (sleeping 1 s) when the stop begins
        assert.truthy(srv:wait_log("slow request started", 15), srv:log())
        srv:signal("TERM")
        local code = srv:wait_exit(10)
        assert.are.equal(0, code, srv:log())
        local out = server.wait_until(20, function()
            local s = server.read_file(outf)
            return s and s:find("rc=") and s
        end)
        assert.truthy(out, "the client finished")
        assert.truthy(out:find("status=200", 1, true), out)
        assert.are.equal("slept", server.read_file(srv.dir .. "/g.body"))
        assert.truthy(out:find("server closed the connection (application 0x100)", 1, true), out)
        assert.truthy(out:find("rc=0", 1, true), out)
        srv:stop()
    end)

    it("serves a page to headless Chromium over h3 (nextHopProtocol)", function()
        local app = APP .. [==[
k.get("/page", function(req, res)
    res.headers["content-type"] = "text/html"
    return [[<html><body><p id="p">waiting</p><script>document.getElementById('p').textContent=
'proto=' + performance.getEntriesByType('navigation')[0].nextHopProtocol;</script></body></html>]]
end)
]==]
        local srv = start { app = app }
        with(srv, function()
            local port = quic_port(srv)
            local spki = srv:log():match("SPKI sha256 (%S+)")
            assert.truthy(spki, srv:log())
            local profile = srv.dir .. "/chromium"
            os.execute("mkdir -p " .. sh_quote(profile))
            local cmd = table.concat({
                "timeout 90 chromium --headless --no-sandbox --disable-gpu",
                "--disable-background-networking --disable-component-update --disable-sync",
                "--no-first-run --user-data-dir=" .. sh_quote(profile),
                "--origin-to-force-quic-on=127.0.0.1:" .. port,
                "--ignore-certificate-errors-spki-list=" .. sh_quote(spki),
                "--dump-dom " .. sh_quote(string.format("https://127.0.0.1:%d/page", port)),
                "2>/dev/null",
            }, " ")
            local out = run(cmd)
            assert.truthy(out:find(">proto=h3<", 1, true), out)
        end)
    end)

    it("keeps a connection on its worker across a NAT rebinding (CID routing, 2 workers)", function()
        local app = APP .. [==[
k.post("/up", function(req) return "got " .. #req:body() end)
]==]
        local srv = start { app = app, workers = 2, args = { "--body-bytes", "10000000", "--log-level", "debug" } }
        with(srv, function()
            local up = upload_file(srv)
            -- the client's source port changes mid-upload without a word to the server (a NAT
            -- rebinding): the kernel's reuseport hash picks a worker anew for the new address,
            -- the CID router sends the packets to the worker that owns the connection. The
            -- change comes after 64 KB of datagrams, while the stream's window (256 KiB) still
            -- lets the client send: on a timer (gtlsclient --nat-rebinding) a fast upload could
            -- end first, and a client that has nothing left to send is never heard again from
            -- its new port
            for i = 1, 4 do
                local _, body, out, rc = h3(srv, "/up", { "-d", "@" .. up, "--rebind-after", "65536" })
                assert.are.equal(0, rc, out)
                assert.truthy(out:find("rebound from port %d+ to port %d+ after %d+ bytes"), "run " .. i .. ": " .. out)
                assert.are.equal("got 2400000", body, out)
            end
            one_connection_per_run(srv, 4)
        end)
    end)

    it("keeps a connection on its worker across a client's migration to a new port (gtlsclient, 2 workers)", function()
        local app = APP .. [==[
k.post("/up", function(req)
    -- the reader gives the stream's window back only as it takes chunks: a pause after the
    -- first holds the client mid-upload (at body_window, 256 KiB) past its migration, 50 ms
    -- after its handshake, however fast the box
    local n, first = 0, true
    for chunk in req:body_reader() do
        n = n + #chunk
        if first then k.sleep(0.3); first = false end
    end
    return "got " .. n
end)
]==]
        local srv = start { app = app, workers = 2, args = { "--body-bytes", "10000000", "--log-level", "debug" } }
        with(srv, function()
            local port = quic_port(srv)
            local up = upload_file(srv)
            -- an active migration (RFC 9000 §9.2): the client moves to a new port and a new
            -- connection ID of the server's and validates the path from there (it probes even
            -- while flow control holds its upload)
            for i = 1, 4 do
                local out, rc = run(string.format("timeout 60 gtlsclient --exit-on-all-streams-close " ..
                    "--change-local-addr=50ms -m POST -d %s 127.0.0.1 %d https://127.0.0.1:%d/up",
                    sh_quote(up), port, port))
                assert.are.equal(0, rc, out:sub(-3000))
                assert.truthy(out:find("Local address is now", 1, true), "run " .. i .. ": it migrated")
                assert.truthy(out:find("[:status: 200]", 1, true), out:sub(-3000))
                assert.truthy(out:find("got 2400000", 1, true), out:sub(-3000))
            end
            one_connection_per_run(srv, 4)
        end)
    end)

    it("answers a packet for an unknown connection ID of its own with a stateless reset", function()
        local srv = start { args = { "--log-level", "debug" } }
        with(srv, function()
            -- a short-header packet whose DCID is 18 bytes starting with worker 0's id: no such
            -- connection, so a stateless reset (shorter than the packet, ending in a 16-byte token)
            local script = string.format([=[
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
pkt = bytes([0x40, 0x00]) + bytes(range(1, 18)) + bytes(40)
s.sendto(pkt, ("127.0.0.1", %d))
data, _ = s.recvfrom(2048)
print("reset", len(data), len(pkt), data[0] & 0xc0)
other = bytes([0x40, 0x07]) + bytes(range(1, 18)) + bytes(40)
s.sendto(other, ("127.0.0.1", %d))
try:
    s.settimeout(1)
    s.recvfrom(2048)
    print("answered another worker's CID")
except socket.timeout:
    print("silent for another worker's CID")
]=], quic_port(srv), quic_port(srv))
            local out = run("/usr/bin/python3 -c " .. sh_quote(script))
            local got, sent, bits = out:match("reset (%d+) (%d+) (%d+)")
            assert.truthy(got, out)
            assert.truthy(tonumber(got) < tonumber(sent), out)
            assert.are.equal(64, tonumber(bits), "a short header with the fixed bit: " .. out)
            assert.truthy(out:find("silent for another worker's CID", 1, true), out)
        end)
    end)

    it("validates new clients' addresses with a Retry above h3_retry_above", function()
        local srv = start { workers = 2, args = { "--h3-retry-above", "0" } }
        with(srv, function()
            local port = quic_port(srv)
            local out, rc = run(string.format("timeout 20 gtlsclient --exit-on-all-streams-close " ..
                "127.0.0.1 %d https://127.0.0.1:%d/", port, port))
            assert.are.equal(0, rc, out:sub(-3000))
            assert.truthy(out:find("type=Retry", 1, true), "the server sent a Retry")
            assert.truthy(out:find("retry_source_connection_id=", 1, true), out:sub(-3000))
            assert.truthy(out:find("[:status: 200]", 1, true), out:sub(-3000))
            local _, _, out2, rc2 = h3(srv, "/", { "--connections", "5", "-w" })
            assert.are.equal(0, rc2, out2)
            assert.are.equal(5, select(2, out2:gsub("status=200", "")), out2)
        end)
        -- under the threshold (the default): no Retry
        local calm = start()
        with(calm, function()
            local port = quic_port(calm)
            local out, rc = run(string.format("timeout 20 gtlsclient --exit-on-all-streams-close " ..
                "127.0.0.1 %d https://127.0.0.1:%d/", port, port))
            assert.are.equal(0, rc, out:sub(-3000))
            assert.falsy(out:find("type=Retry", 1, true), "no Retry")
        end)
    end)

    it("serves h3 from every worker", function()
        local srv = start { workers = 2 }
        with(srv, function()
            local _, _, out, rc = h3(srv, "/", { "--connections", "20", "-w" })
            assert.are.equal(0, rc, out)
            assert.are.equal(20, select(2, out:gsub("status=200", "")), out)
        end)
    end)
end)
