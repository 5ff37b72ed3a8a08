-- spec/tls_spec.lua: TLS 1.3 as a transport (core/kh_tls.c): real clients (curl, openssl
-- s_client) against the real binary. The request specs also run over TLS through
-- server.each_protocol ("h1+tls"); this file covers what only TLS has: versions, ALPN, SNI,
-- resumption, certificate errors, the handshake timeout, cleartext sent to a TLS port.
local server = require "helpers.server"

local sh_quote = server.sh_quote

-- Runs a shell command; returns its stdout+stderr and exit code.
local function run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"__rc=$?\"", "r"))
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("__rc=(%d+)%s*$"))
    return out:gsub("__rc=%d+%s*$", ""), rc
end

local function tmpdir()
    local p = assert(io.popen("mktemp -d /tmp/kspec.XXXXXX"))
    local d = p:read("*l")
    p:close()
    return d
end

-- openssl s_client against a TLS listener; `input` is sent, then the client waits (-ign_eof)
-- until the server closes, so post-handshake messages (tickets) are read.
local function s_client(srv, args, input)
    local l = srv.tls_listens[1]
    input = input or "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    return run(string.format("printf %s | timeout 10 openssl s_client -connect %s:%d -ign_eof %s",
        sh_quote(input:gsub("\r", "\\r"):gsub("\n", "\\n")), l.host, l.port, args or ""))
end

local function curl(srv, args, path)
    local l = srv.tls_listens[1]
    return run(string.format("curl -sS -v -k --max-time 5 %s https://%s:%d%s", args or "",
        l.host, l.port, path or "/"))
end

local APP = [[
local k = require "khamsin"
k.get("/", function() return "hello over tls" end)
k.get("/big", function() return string.rep("0123456789abcdef", 131072) end) -- 2 MiB
k.post("/echo", function(req) return 200, req:body() end)
k.get("/scheme", function(req) return req.method .. " " .. req.path end)
]]

describe("TLS", function()
    describe("with --tls-self-signed", function()
        local srv
        setup(function()
            srv = server.start { app = APP, tls = true, workers = 2 }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        it("logs a TLS listener and the SPKI hash of the generated certificate", function()
            local log = srv:log()
            assert.truthy(log:find("listening on 127%.0%.0%.1:%d+ %(tls%)"))
            local spki = log:match("SPKI sha256 (%S+)")
            assert.truthy(spki, log)
            assert.are.equal(44, #spki) -- base64 of 32 bytes
            -- the same hash as openssl computes from the certificate the server presents
            local out = run(string.format(
                "echo | timeout 5 openssl s_client -connect 127.0.0.1:%d 2>/dev/null | openssl x509 -pubkey -noout"
                .. " | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
                srv.tls_listens[1].port))
            assert.are.equal(spki, (out:gsub("%s+$", "")))
        end)

        it("serves curl over TLS 1.3 with ALPN http/1.1", function()
            local out, rc = curl(srv, "--http1.1")
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("SSL connection using TLSv1.3", 1, true), out)
            assert.truthy(out:find("ALPN: server accepted http/1.1", 1, true), out)
            assert.truthy(out:find("hello over tls", 1, true), out)
        end)

        it("echoes a 1 MiB body and sends a 2 MiB response (many records)", function()
            local body = string.rep("x", 1048576 - 3) .. "end"
            local r = srv:request { proto = "h1+tls", method = "POST", path = "/echo", body = body }
            assert.are.equal(200, r.status, r.err)
            assert.are.equal(#body, #r.body)
            assert.are.equal(body, r.body)
            r = srv:request { proto = "h1+tls", path = "/big" }
            assert.are.equal(200, r.status, r.err)
            assert.are.equal(2097152, #r.body)
        end)

        it("answers 40 KeyUpdate requests made while it sent nothing with one KeyUpdate", function()
            -- RFC 8446 4.6.3: one update before our next data; 40 in a row would exceed what a
            -- peer counting them accepts (BoringSSL refuses a 33rd in a row)
            local l = srv.tls_listens[1]
            local out = run(string.format("python3 %s %s %d 40",
                sh_quote(server.root .. "/spec/helpers/key_updates.py"), l.host, l.port))
            local sent, received, status = out:match("sent (%d+) received (%d+) status (%d+)")
            assert.are.equal("40", sent, out)
            assert.are.equal("1", received, out)
            assert.are.equal("200", status, out)
        end)

        it("keeps a connection alive across requests", function()
            local out, rc = curl(srv, "--http1.1", "/ https://127.0.0.1:" .. srv.tls_listens[1].port .. "/scheme")
            assert.are.equal(0, rc, out)
            assert.truthy(out:find("Re%-using existing connection"), out)
            assert.truthy(out:find("GET /scheme", 1, true), out)
        end)

        it("negotiates TLS 1.3 and ALPN http/1.1 with openssl s_client", function()
            local out = s_client(srv, "-tls1_3 -alpn http/1.1")
            assert.truthy(out:find("New, TLSv1.3", 1, true), out)
            assert.truthy(out:find("ALPN protocol: http/1.1", 1, true), out)
            assert.truthy(out:find("hello over tls", 1, true), out)
        end)

        it("answers a client without ALPN with HTTP/1.1", function()
            local out = s_client(srv, "-tls1_3")
            assert.truthy(out:find("No ALPN negotiated", 1, true), out)
            assert.truthy(out:find("HTTP/1.1 200", 1, true), out)
        end)

        it("refuses TLS 1.2 by default", function()
            local out = s_client(srv, "-tls1_2")
            assert.falsy(out:find("New, TLSv1.2", 1, true), out)
            assert.truthy(out:find("alert protocol version", 1, true) or out:find("no protocols available", 1, true)
                or out:find("New, (NONE)", 1, true), out)
        end)

        it("resumes a session from a ticket, on any worker", function()
            local dir = tmpdir()
            local sess = dir .. "/sess.pem"
            local out = s_client(srv, "-tls1_3 -sess_out " .. sess)
            assert.truthy(out:find("New, TLSv1.3", 1, true), out)
            -- two workers: a few tries land on both; every one must resume (shared ticket keys)
            for _ = 1, 4 do
                out = s_client(srv, "-tls1_3 -sess_in " .. sess)
                assert.truthy(out:find("Reused, TLSv1.3", 1, true), out)
                assert.truthy(out:find("hello over tls", 1, true), out)
            end
            os.execute("rm -rf " .. sh_quote(dir))
        end)

        it("sends a fresh ticket on every resumption, so a single-use client keeps resuming", function()
            -- browsers use a TLS 1.3 ticket once: each resumed connection must bring the next one
            local dir = tmpdir()
            local out = s_client(srv, "-tls1_3 -sess_out " .. dir .. "/s0.pem")
            assert.truthy(out:find("New, TLSv1.3", 1, true), out)
            for i = 1, 3 do
                local prev, cur = dir .. "/s" .. (i - 1) .. ".pem", dir .. "/s" .. i .. ".pem"
                out = s_client(srv, "-tls1_3 -sess_in " .. prev .. " -sess_out " .. cur)
                assert.truthy(out:find("Reused, TLSv1.3", 1, true), out)
                assert.truthy(out:find("Post-Handshake New Session Ticket arrived", 1, true), out)
                local a, b = io.open(prev):read("*a"), io.open(cur)
                assert.truthy(b, "no session written after resumption " .. i)
                assert.are_not.equal(a, b:read("*a"))
                b:close()
            end
            os.execute("rm -rf " .. sh_quote(dir))
        end)

        it("prefers TLS_AES_128_GCM_SHA256 and still serves and resumes a client's only suite", function()
            -- kh_tls.c prefer_aes128: OpenSSL's default order puts AES-256 first; we put
            -- AES-128-GCM first (a SHA-256 key schedule), and a client that offers one suite gets it
            local dir = tmpdir()
            for _, c in ipairs {
                { "", "TLS_AES_128_GCM_SHA256" },
                { "-ciphersuites TLS_AES_256_GCM_SHA384", "TLS_AES_256_GCM_SHA384" },
                { "-ciphersuites TLS_CHACHA20_POLY1305_SHA256", "TLS_CHACHA20_POLY1305_SHA256" },
            } do
                local sess = dir .. "/sess.pem"
                os.remove(sess)
                local out = s_client(srv, "-tls1_3 " .. c[1] .. " -sess_out " .. sess)
                assert.truthy(out:find("New, TLSv1.3, Cipher is " .. c[2], 1, true), out)
                assert.truthy(out:find("hello over tls", 1, true), out)
                out = s_client(srv, "-tls1_3 " .. c[1] .. " -sess_in " .. sess)
                assert.truthy(out:find("Reused, TLSv1.3, Cipher is " .. c[2], 1, true), out)
                assert.truthy(out:find("hello over tls", 1, true), out)
            end
            os.execute("rm -rf " .. sh_quote(dir))
        end)

        it("closes plain HTTP sent to the TLS port without a reply or an [error] line", function()
            local data, closed = srv:raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                { listen = srv.tls_listens[1], timeout = 3 })
            assert.is_true(closed)
            assert.falsy(data:find("HTTP/1.1", 1, true))
            assert.are.same({}, srv:unexpected_errors())
        end)

        it("closes on garbage after the handshake started", function()
            local c = assert(srv:raw_conn { listen = srv.tls_listens[1] })
            c:send("\22\3\1\0\5hello" .. string.rep("\0", 64))
            assert.is_true((c:wait_closed(3)))
            c:close()
        end)
    end)

    describe("handshake timeout", function()
        it("closes a connection whose handshake stalls", function()
            local srv = server.start { app = APP, tls = true, args = { "--tls-handshake-timeout-ms", "300" } }
            local ok, err = pcall(function()
                local c = assert(srv:raw_conn { listen = srv.tls_listens[1] })
                local t0 = server.now()
                c:send("\22\3\1\2\0\1\0\1\252\3\3") -- the first bytes of a ClientHello, then silence
                local closed = c:wait_closed(3)
                local took = server.now() - t0
                c:close()
                assert.is_true(closed)
                assert.is_true(took >= 0.25 and took < 2, "closed after " .. took .. " s")
                -- an idle connection that sends nothing at all is closed too
                c = assert(srv:raw_conn { listen = srv.tls_listens[1] })
                closed = c:wait_closed(3)
                c:close()
                assert.is_true(closed)
            end)
            srv:stop()
            assert(ok, err)
        end)
    end)

    describe("keep-alive", function()
        -- luasec (Debian lua-sec) for a TLS connection the spec controls byte by byte
        local ssl = require "ssl"
        local socket = require "socket"

        local function tls_conn(l)
            local tcp = assert(socket.tcp())
            tcp:settimeout(3)
            assert(tcp:connect(l.host, l.port))
            local c = assert(ssl.wrap(tcp, { mode = "client", protocol = "any", verify = "none",
                alpn = "http/1.1" }))
            c:settimeout(3)
            assert(c:dohandshake())
            return c
        end

        local function get(c, path)
            assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"))
            local head = {}
            while true do
                local line = assert(c:receive("*l"))
                if line == "" then break end
                head[#head + 1] = line
            end
            local len = tonumber(table.concat(head, "\n"):lower():match("content%-length: *(%d+)"))
            return head[1], assert(c:receive(len))
        end

        it("waits for the next request with the idle timeout, not the header timeout", function()
            local srv = server.start { app = APP, tls = true,
                args = { "--header-timeout-ms", "400", "--keepalive-timeout-ms", "1500" } }
            local ok, err = pcall(function()
                local c = tls_conn(srv.tls_listens[1])
                local status, body = get(c, "/")
                assert.are.equal("HTTP/1.1 200 OK", status)
                assert.are.equal("hello over tls", body)
                server.sleep(0.9) -- past header_timeout_ms, within keepalive_timeout_ms
                status, body = get(c, "/scheme")
                assert.are.equal("GET /scheme", body)
                -- then the idle timeout closes it
                c:settimeout(4)
                local t0 = server.now()
                local _, rerr = c:receive(1)
                -- with close_notify first (RFC 8446 §6.1): luasec says "closed", not
                -- "unexpected eof while reading"
                assert.are.equal("closed", rerr)
                local took = server.now() - t0
                assert.is_true(took > 1 and took < 3, "closed after " .. took .. " s")
                c:close()
            end)
            srv:stop()
            assert(ok, err)
        end)

        it("answers pipelined requests sent in one TLS record, in order", function()
            local srv = server.start { app = APP, tls = true }
            local ok, err = pcall(function()
                local c = tls_conn(srv.tls_listens[1])
                assert(c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /scheme HTTP/1.1\r\nHost: x\r\n\r\n"))
                local data = ""
                server.wait_until(3, function()
                    local chunk, e, partial = c:receive(4096)
                    data = data .. (chunk or partial or "")
                    return #server.parse_responses(data) >= 2 or e == "closed"
                end)
                local list = server.parse_responses(data)
                assert.are.equal(2, #list)
                assert.are.equal("hello over tls", list[1].body)
                assert.are.equal("GET /scheme", list[2].body)
                c:close()
            end)
            srv:stop()
            assert(ok, err)
        end)
    end)

    describe("session ticket keys", function()
        it("rotate: a ticket resumes while its key is current or previous, not after", function()
            -- tls_ticket_rotate_s = 3: a key encrypts for 3 s, then only decrypts until it is 6 s old;
            -- the session's own lifetime is 3 s too, counted by OpenSSL in whole seconds, so the
            -- resumption comes 1 s after the first handshake (with 2 s and 1.5 s a resumption
            -- that reached a loaded server 0.5 s late could find its session 3 "seconds" old)
            local srv = server.start { app = APP, tls = true, args = { "--tls-ticket-rotate-s", "3" } }
            local ok, err = pcall(function()
                local dir = tmpdir()
                local sess = dir .. "/sess.pem"
                local t0 = server.now()
                local out = s_client(srv, "-sess_out " .. sess)
                assert.truthy(out:find("New, TLSv1.3", 1, true), out)
                server.sleep(math.max(0, t0 + 1 - server.now()))
                out = s_client(srv, "-sess_in " .. sess)
                assert.truthy(out:find("Reused, TLSv1.3", 1, true), out) -- a new ticket now rotates the key
                server.sleep(math.max(0, t0 + 8.5 - server.now()))
                out = s_client(srv, "-sess_in " .. sess)
                assert.truthy(out:find("New, TLSv1.3", 1, true), out) -- its key is gone: full handshake
                os.execute("rm -rf " .. sh_quote(dir))
            end)
            srv:stop()
            assert(ok, err)
        end)
    end)

    -- After a TLS 1.3 handshake kh_tls frees OpenSSL's SSL object and protects records itself
    -- (core/kh_tls13.c); unit.tls13 checks it against OpenSSL as the peer, these check it
    -- against real clients through the real server.
    describe("our record layer after the handshake", function()
        local srv
        setup(function()
            srv = server.start { app = APP, tls = true, args = { "--log-level", "debug" } }
        end)
        teardown(function()
            if srv then srv:stop() end
        end)

        for _, suite in ipairs { "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                                 "TLS_CHACHA20_POLY1305_SHA256" } do
            it("takes over " .. suite .. " for HTTP/1.1 and h2, with large bodies both ways", function()
                local body = string.rep("y", 300000 - 3) .. "end"
                local f = os.tmpname()
                server.write_file(f, body)
                local l = srv.tls_listens[1]
                for _, v in ipairs { "--http1.1", "--http2" } do
                    local out, rc = run(string.format(
                        "curl -sS -k --max-time 10 %s --tls13-ciphers %s --data-binary @%s https://%s:%d/echo",
                        v, suite, f, l.host, l.port))
                    assert.are.equal(0, rc, out)
                    assert.are.equal(#body, #out, v)
                    assert.are.equal(body, out, v)
                end
                os.remove(f)
            end)
        end

        it("takes over resumed sessions too, and never leaves a TLS 1.3 connection to OpenSSL", function()
            local dir = tmpdir()
            s_client(srv, "-tls1_3 -sess_out " .. dir .. "/s.pem")
            local out = s_client(srv, "-tls1_3 -sess_in " .. dir .. "/s.pem")
            os.execute("rm -rf " .. sh_quote(dir))
            assert.truthy(out:find("Reused, TLSv1.3", 1, true), out)
            assert.truthy(out:find("hello over tls", 1, true), out)
            assert.truthy(srv:log():find("resumed", 1, true))
            assert.falsy(srv:log():find("OpenSSL keeps the record layer", 1, true), srv:log())
            -- the handshakes after the first closed connection start on the key-log-free twin
            -- ctx and move to the one with the key log after the certificate (kh_tls.c info_cb):
            -- had the move failed, the hand-off would lack its secrets (asserted just above)
            assert.truthy(srv:log():find("key-log-free SSL_CTX twins built (1)", 1, true), srv:log())
        end)

        it("leaves the record layer to OpenSSL with --tls-own-records 0", function()
            local srv0 = server.start { app = APP, tls = true,
                                        args = { "--tls-own-records", "0", "--log-level", "debug" } }
            local ok, err = pcall(function()
                local out, rc = curl(srv0, "--http1.1")
                assert.are.equal(0, rc, out)
                assert.truthy(out:find("hello over tls", 1, true), out)
                assert.truthy(srv0:log():find("OpenSSL keeps the record layer (tls_own_records is 0", 1, true),
                    srv0:log())
            end)
            srv0:stop()
            assert(ok, err)
        end)

        it("answers a record that fails authentication with bad_record_mac and closes", function()
            local l = srv.tls_listens[1]
            local script = [=[
import os, socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = ctx.wrap_socket(socket.create_connection((sys.argv[1], int(sys.argv[2]))))
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
first = s.recv(4096)
raw = socket.socket(fileno=os.dup(s.fileno()))
raw.sendall(b"\x17\x03\x03\x00\x20" + os.urandom(32))  # an application_data record, forged
try:
    more = s.recv(4096)
    print("recv", more)
except ssl.SSLError as e:
    print("alert", e.reason)
print("first-ok" if b"hello over tls" in first else "first-bad")
]=]
            local f = os.tmpname()
            server.write_file(f, script)
            local out = run(string.format("timeout 10 /usr/bin/python3 %s %s %d", f, l.host, l.port))
            os.remove(f)
            assert.truthy(out:find("first-ok", 1, true), out)
            assert.truthy(out:find("alert SSLV3_ALERT_BAD_RECORD_MAC", 1, true)
                or out:find("alert BAD_RECORD_MAC", 1, true), out)
            assert.truthy(srv:log():find("alert 20 sent", 1, true), srv:log())
        end)
    end)

    -- RFC 8446 §6.1: close_notify before every close we decide (timeouts, graceful stop, the
    -- peer's own close_notify), in both record layers. Python's ssl with suppress_ragged_eofs
    -- and OP_IGNORE_UNEXPECTED_EOF off tells the two ends apart: recv() returns b"" after close_notify and raises SSLEOFError
    -- on a bare FIN; unwrap() returns only once the server's close_notify answered ours.
    describe("close_notify (RFC 8446 §6.1)", function()
        local PY = [=[
import socket, ssl, sys
host, port, mode, outp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def say(x):
    with open(outp, "a") as f:
        f.write(x + "\n")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.options &= ~ssl.OP_IGNORE_UNEXPECTED_EOF  # on by default in 3.11: a FIN would pass as b""
ctx.set_alpn_protocols(["h2"] if mode == "h2" else ["http/1.1"])
t = ctx.wrap_socket(socket.create_connection((host, port), timeout=40), suppress_ragged_eofs=False)
if mode == "h2":  # the preface and an empty SETTINGS frame
    t.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
elif mode == "body":  # a body that never completes
    t.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
elif mode != "silent":
    t.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if mode == "close" else b"") + b"\r\n")
    buf = b""
    while b"hello over tls" not in buf:
        d = t.recv(4096)
        if not d:
            break
        buf += d
    say("response " + ("ok" if b"hello over tls" in buf else repr(buf)))
say("ready")
try:
    if mode == "peer":
        t.unwrap()
        say("end close_notify")
    else:
        seen = b""
        while True:
            d = t.recv(65536)
            if d == b"":
                say("got " + ("408" if b" 408 " in seen else "no 408"))
                say("end close_notify")
                break
            seen += d
except ssl.SSLEOFError:
    say("end ragged EOF")
except ssl.SSLError as e:
    say(("end ragged EOF " if "UNEXPECTED_EOF" in str(e) else "end error ") + repr(e))
except socket.timeout:
    say("end timeout")
except Exception as e:
    say("end error " + repr(e))
]=]
        local py
        setup(function()
            py = os.tmpname()
            server.write_file(py, PY)
        end)
        teardown(function()
            os.remove(py)
        end)

        -- starts the client in the background; returns the file it reports to
        local function client(srv, mode)
            local out = os.tmpname()
            local l = srv.tls_listens[1]
            os.execute(string.format("timeout 60 /usr/bin/python3 %s %s %d %s %s >>%s 2>&1 &",
                sh_quote(py), l.host, l.port, mode, sh_quote(out), sh_quote(out)))
            return out
        end

        local function wait_line(out, pattern, timeout)
            return server.wait_until(timeout, function()
                return (server.read_file(out) or ""):match(pattern)
            end, 0.05)
        end

        local function finish(out)
            local ended = wait_line(out, "end [^\n]*", 45)
            local text = server.read_file(out) or ""
            os.remove(out)
            return ended, text
        end

        for _, own in ipairs { "1", "0" } do
            local layer = own == "1" and "our record layer" or "OpenSSL's (--tls-own-records 0)"
            describe("with " .. layer, function()
                local srv
                setup(function()
                    srv = server.start { app = APP, tls = true, args = { "--tls-own-records", own,
                        "--keepalive-timeout-ms", "1000", "--header-timeout-ms", "1000",
                        "--body-timeout-ms", "1000" } }
                end)
                teardown(function()
                    if srv then srv:stop() end
                end)

                for _, case in ipairs {
                    { "idle", "on the keep-alive timeout" },
                    { "silent", "on the header timeout (no request after the handshake)" },
                    { "body", "after the 408 of a body timeout" },
                    { "h2", "on the HTTP/2 idle timeout" },
                    { "peer", "in answer to the peer's close_notify" },
                    -- the response's last bytes and close_notify leave in one write; the
                    -- close lingers (our FIN, then reading) until the client's FIN
                    { "close", "after a Connection: close response, behind it" },
                } do
                    it("sends close_notify " .. case[2], function()
                        local ended, text = finish(client(srv, case[1]))
                        assert.are.equal("end close_notify", ended, text)
                        if case[1] == "idle" or case[1] == "peer" or case[1] == "close" then
                            assert.truthy(text:find("response ok", 1, true), text)
                        elseif case[1] == "body" then
                            assert.truthy(text:find("got 408", 1, true), text)
                        end
                    end)
                end

                it("sends close_notify on a graceful stop, over HTTP/1.1 and h2", function()
                    local s2 = server.start { app = APP, tls = true,
                        args = { "--tls-own-records", own } } -- keep-alive: 60 s
                    local h1 = client(s2, "idle")
                    local h2 = client(s2, "h2")
                    local ready = wait_line(h1, "ready", 20) and wait_line(h2, "ready", 20)
                    s2:stop() -- SIGTERM: a graceful stop
                    local e1, t1 = finish(h1)
                    local e2, t2 = finish(h2)
                    assert.truthy(ready, t1 .. t2)
                    assert.truthy(t1:find("response ok", 1, true), t1)
                    assert.are.equal("end close_notify", e1, t1)
                    assert.are.equal("end close_notify", e2, t2)
                end)
            end)
        end
    end)

    describe("--tls12", function()
        it("accepts TLS 1.2 (ECDHE with AEAD only) and still prefers TLS 1.3", function()
            local srv = server.start { app = APP, tls = true, args = { "--tls12", "--log-level", "debug" } }
            local ok, err = pcall(function()
                local out = s_client(srv, "-tls1_2 -alpn http/1.1")
                assert.truthy(out:find("New, TLSv1.2, Cipher is ECDHE%-"), out)
                assert.truthy(out:find("hello over tls", 1, true), out)
                out = s_client(srv, "-tls1_2 -cipher AES128-SHA256")
                assert.falsy(out:find("New, TLSv1.2", 1, true), out) -- no static RSA, no CBC
                out = s_client(srv, "")
                assert.truthy(out:find("New, TLSv1.3", 1, true), out)
                -- TLS 1.2 keeps OpenSSL's record layer (ours is TLS 1.3 only)
                assert.truthy(srv:log():find("OpenSSL keeps the record layer (not TLS 1.3)", 1, true),
                    srv:log())
                -- TLS 1.2 resumption through the same ticket keys
                local dir = tmpdir()
                s_client(srv, "-tls1_2 -sess_out " .. dir .. "/s.pem")
                out = s_client(srv, "-tls1_2 -sess_in " .. dir .. "/s.pem")
                assert.truthy(out:find("Reused, TLSv1.2", 1, true), out)
                os.execute("rm -rf " .. sh_quote(dir))
            end)
            srv:stop()
            assert(ok, err)
        end)
    end)

    describe("certificates from files", function()
        local dir
        setup(function()
            dir = tmpdir()
            -- a.test: ECDSA P-256, self-signed; b.test: RSA 2048 signed by a CA, chain in the file
            local script = [[
set -e
cd DIR
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout a.key -out a.crt \
  -days 2 -subj /CN=a.test -addext subjectAltName=DNS:a.test 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=khamsin-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout b.key -out b.csr -subj /CN=b.test 2>/dev/null
printf 'subjectAltName=DNS:b.test,DNS:*.b.test\n' > b.ext
openssl x509 -req -in b.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out b.leaf -days 2 -extfile b.ext 2>/dev/null
cat b.leaf ca.crt > b.crt
printf 'not a certificate\n' > junk.pem
openssl ec -in a.key -out a.sec1 2>/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -keyout c.key -out c.crt \
  -days 2 -subj /CN=c.test 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out d.key 2>/dev/null
]]
            local out, rc = run("sh -c " .. sh_quote((script:gsub("DIR", dir))))
            assert(rc == 0, out)
        end)
        teardown(function()
            if dir then os.execute("rm -rf " .. sh_quote(dir)) end
        end)

        local function subject(srv, sni)
            local out = s_client(srv, sni and ("-servername " .. sni) or "-noservername")
            return out:match("subject=CN ?= ?([%w%.%-]+)"), out
        end

        local function start_fails(args)
            local out, rc = run(sh_quote(server.bin()) .. " --listen 127.0.0.1:0 " .. args .. " /dev/null")
            return rc, out
        end

        it("picks the certificate by SNI, the first pair by default, and sends the chain", function()
            local srv = server.start { app = APP, listen = { "tls://127.0.0.1:0" }, args = {
                "--tls-cert", dir .. "/a.crt", "--tls-key", dir .. "/a.key",
                "--tls-cert", dir .. "/b.crt", "--tls-key", dir .. "/b.key", "--log-level", "debug" } }
            local ok, err = pcall(function()
                local s, out = subject(srv, "a.test")
                assert.are.equal("a.test", s, out)
                s, out = subject(srv, "b.test")
                assert.are.equal("b.test", s, out)
                assert.truthy(out:find("khamsin%-test%-ca"), out) -- the intermediate is in the chain
                s, out = subject(srv, "www.b.test")
                assert.are.equal("b.test", s, out)
                s, out = subject(srv, "other.test")
                assert.are.equal("a.test", s, out)
                s, out = subject(srv, nil)
                assert.are.equal("a.test", s, out)
                -- and the RSA certificate verifies against its CA with curl
                local l = srv.tls_listens[1]
                out = run(string.format("curl -sS --max-time 5 --cacert %s/ca.crt --resolve b.test:%d:127.0.0.1 https://b.test:%d/",
                    dir, l.port, l.port))
                assert.are.equal("hello over tls", out)
                -- after the first connection, SNI picks among the key-log-free twins (kh_tls.c
                -- kh_tls_ctx.quiet), and every connection still gets its secrets for the hand-off
                local log = srv:log()
                assert.truthy(log:find("key-log-free SSL_CTX twins built (2)", 1, true), log)
                assert.falsy(log:find("OpenSSL keeps the record layer", 1, true), log)
            end)
            srv:stop()
            assert(ok, err)
        end)

        -- kh_tls.c reads EC keys through the ASN.1 templates (ec_key_read), not a decoder: both
        -- PEM forms, another curve, and a key of another type (RSA, b) on the decoder path
        it("reads EC keys as PKCS#8 and as SEC1 (EC PRIVATE KEY), P-256 and P-384, and RSA keys", function()
            local f = assert(io.open(dir .. "/a.sec1"))
            assert.truthy(f:read("*a"):find("BEGIN EC PRIVATE KEY", 1, true))
            f:close()
            for _, pair in ipairs { { "a.crt", "a.sec1", "a.test" }, { "c.crt", "c.key", "c.test" },
                                    { "b.crt", "b.key", "b.test" } } do
                local srv = server.start { app = APP, listen = { "tls://127.0.0.1:0" }, args = {
                    "--tls-cert", dir .. "/" .. pair[1], "--tls-key", dir .. "/" .. pair[2] } }
                local ok, err = pcall(function()
                    local s, out = subject(srv, nil)
                    assert.are.equal(pair[3], s, out)
                    local r = srv:request { proto = "h1+tls" }
                    assert.are.equal("hello over tls", r.body, r.err)
                end)
                srv:stop()
                assert(ok, err)
            end
        end)

        it("refuses at start an EC key that is not the certificate's, naming the key file", function()
            for _, key in ipairs { "d.key", "c.key" } do -- P-256 but another key; another curve
                local rc, out = start_fails("--tls-cert " .. dir .. "/a.crt --tls-key " .. dir .. "/" .. key)
                assert.are_not.equal(0, rc)
                assert.truthy(out:find(dir .. "/" .. key, 1, true), out)
                assert.truthy(out:find("mismatch", 1, true), out) -- OpenSSL's words, loaded on error
            end
        end)

        it("serves cleartext and TLS listeners side by side", function()
            local srv = server.start { app = APP, listen = { "127.0.0.1:0", "tcp://127.0.0.1:0" },
                args = { "--tls-cert", dir .. "/a.crt", "--tls-key", dir .. "/a.key" } }
            local ok, err = pcall(function()
                -- a bare HOST:PORT is TLS once a certificate is configured
                assert.are.equal(1, #srv.tls_listens)
                assert.truthy(srv:log():find("%(tls%)"))
                assert.truthy(srv:log():find("%(tcp%)"))
                local r = srv:request { proto = "h1+tls" }
                assert.are.equal("hello over tls", r.body, r.err)
                local plain
                for _, l in ipairs(srv.listens) do if not l.tls then plain = l end end
                r = srv:request { proto = "h1", listen = plain }
                assert.are.equal("hello over tls", r.body, r.err)
            end)
            srv:stop()
            assert(ok, err)
        end)

        it("exits non-zero with a message naming a missing certificate file", function()
            local rc, out = start_fails("--tls-cert " .. dir .. "/missing.crt --tls-key " .. dir .. "/a.key")
            assert.are_not.equal(0, rc)
            assert.truthy(out:find(dir .. "/missing.crt", 1, true), out)
            assert.truthy(out:find("No such file", 1, true), out)
        end)

        it("exits non-zero on a file that is not a certificate, a wrong key, a missing key", function()
            local rc, out = start_fails("--tls-cert " .. dir .. "/junk.pem --tls-key " .. dir .. "/a.key")
            assert.are_not.equal(0, rc)
            assert.truthy(out:find(dir .. "/junk.pem", 1, true), out)
            -- OpenSSL's error strings are loaded when an error is formatted, not at start-up
            -- (kh_tls_err_strings): the reason is words, not a number
            assert.truthy(out:find("PEM routines::no start line", 1, true), out)
            rc, out = start_fails("--tls-cert " .. dir .. "/a.crt --tls-key " .. dir .. "/b.key")
            assert.are_not.equal(0, rc)
            assert.truthy(out:find(dir .. "/b.key", 1, true) and out:find("does not match", 1, true), out)
            rc, out = start_fails("--tls-cert " .. dir .. "/a.crt")
            assert.are_not.equal(0, rc)
            assert.truthy(out:find("--tls-key", 1, true), out)
            rc, out = start_fails("--listen tls://127.0.0.1:0")
            assert.are_not.equal(0, rc)
            assert.truthy(out:find("--tls-self-signed", 1, true), out)
        end)
    end)

    it("documents the TLS options in --help", function()
        local out, rc = run(sh_quote(server.bin()) .. " --help")
        assert.are.equal(0, rc)
        for _, opt in ipairs { "--tls-cert", "--tls-key", "--tls-self-signed", "--tls12", "tls://" } do
            assert.truthy(out:find(opt, 1, true), opt)
        end
    end)
end)
