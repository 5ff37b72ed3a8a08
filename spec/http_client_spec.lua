-- k.http (issue 14, item 3): the HTTP client against real servers: a second khamsin (HTTP/1.1
-- cleartext, HTTP/1.1 over TLS, HTTP/2 over TLS by ALPN), nginx (keep-alive, gzip), and
-- spec/helpers/broken_server.py (closes mid-body, lies about Content-Length, never answers,
-- resets, bad chunks, ambiguous framing, corrupt gzip, a gzip bomb, redirects). Each failure
-- is asserted with its exact reason. The client runs inside a handler of the khamsin under test;
-- the spec asks it over curl and reads a JSON report.
local server = require "spec.helpers.server"
local upstream = require "spec.helpers.upstream"
local nginx = require "spec.helpers.nginx"
local cjson = require "cjson"

local BROKEN = server.root .. "/spec/helpers/broken_server.py"

local function start_broken() return upstream.start(BROKEN) end

local stop_broken = upstream.stop

-- The upstream khamsin: what the client talks to.
local UPSTREAM = [[
local k = require "khamsin"
k.get("/hello", function() return "hello" end)
k.get("/big", function() return ("0123456789abcdef"):rep(65536) end) -- 1 MiB
k.post("/echo", function(req) return req.method .. ":" .. req:body() end)
k.put("/echo", function(req) return req.method .. ":" .. req:body() end)
k.get("/hdr", function(req)
    return (req.headers["x-test"] or "-") .. "|" .. (req.headers["user-agent"] or "-")
end)
k.get("/status/:n", function(req, res) res.status = tonumber(req.params.n) return "" end)
k.get("/slow", function() k.sleep(2) return "late" end)
]]

-- The khamsin under test: /do runs k.http.request with the JSON options in the body.
local CLIENT = [[
local k = require "khamsin"
local json = k.json
k.post("/do", function(req)
    local o = json.decode(req:body())
    local want = o.want_header
    o.want_header = nil
    local t0 = k.now()
    local res, err = k.http.request(o)
    local out = { took = k.now() - t0 }
    if not res then
        out.err = err
    else
        out.status = res.status
        out.version = res.version
        out.body_len = #res.body
        out.body = #res.body <= 4096 and res.body or res.body:sub(1, 64)
        out.decoded = res.decoded
        out.url = res.url
        if want then out.header = res.headers[want] or json.null end
    end
    return json.encode(out)
end)
-- n requests one after another on the same origin: the keep-alive pool shows in the bodies
k.post("/seq", function(req)
    local o = json.decode(req:body())
    local bodies = {}
    for i = 1, o.n do
        local res, err = k.http.request { url = o.url, cafile = o.cafile, verify = o.verify,
            h2c = o.h2c }
        bodies[i] = res and res.body or ("ERR " .. tostring(err))
    end
    return json.encode(bodies)
end)
-- a streamed body read through res:reader()
k.post("/stream", function(req)
    local o = json.decode(req:body())
    o.stream = true
    local res, err = k.http.request(o)
    if not res then return json.encode { err = err } end
    local n, chunks, rerr = 0, 0, nil
    local rd = res:reader()
    while true do
        local c, e = rd()
        if not c then rerr = e break end
        n, chunks = n + #c, chunks + 1
    end
    return json.encode { status = res.status, len = n, chunks = chunks, err = rerr,
        body_nil = res.body == nil }
end)
k.get("/misuse", function(req)
    local ok, e = pcall(k.http.request, { url = 42 })
    local ok2, e2 = pcall(k.http.get, "http://x/", "notatable")
    local inj = {}
    for _, u in ipairs { req.args.h1, req.args.h2 } do
        local ok3, e3 = pcall(k.http.request, { url = u, cafile = req.args.ca,
            headers = { ["X-A"] = "a\r\nEvil: 1" } })
        inj[#inj + 1] = { ok = ok3, e = tostring(e3) }
    end
    return json.encode { ok = ok, e = tostring(e), ok2 = ok2, e2 = tostring(e2), inj = inj }
end)
k.get("/leave", function(req)
    -- the client of this request leaves; the wait must end with it
    local res, err = k.http.get("http://127.0.0.1:" .. req.args.port .. "/", { timeout = 30 })
    return "never " .. tostring(err)
end)
]]

local up, cli, broken, certdir, ngx

local function call(path, opts, timeout)
    local res = cli:request { method = "POST", path = path, body = cjson.encode(opts),
        timeout = timeout or 30 }
    assert.are.equal(200, res.status, res.body)
    return cjson.decode(res.body)
end

local function do_req(opts, timeout)
    return call("/do", opts, timeout)
end

local function up_url(path, tls)
    for _, l in ipairs(up.listens) do
        if (l.tls or false) == (tls or false) then
            return (tls and "https://" or "http://") .. "127.0.0.1:" .. l.port .. path
        end
    end
end

local function B(mode, path)
    return "http://127.0.0.1:" .. broken.ports[mode] .. (path or "/")
end

describe("k.http", function()
    setup(function()
        broken = start_broken()
        certdir = upstream.make_cert()
        up = server.start {
            app = UPSTREAM,
            listen = { "tcp://127.0.0.1:0", "tls://127.0.0.1:0" },
            args = { "--tls-cert", certdir .. "/cert.pem", "--tls-key", certdir .. "/key.pem" },
        }
        cli = server.start { app = CLIENT, tls = false }
        ngx = nginx.start(function(ports, dir)
            return table.concat({
                "server {",
                "  listen 127.0.0.1:" .. ports[1] .. ";",
                "  keepalive_requests 1000;",
                "  gzip on; gzip_types text/plain; gzip_min_length 10;",
                "  location = /page.txt { default_type text/plain; return 200 '"
                    .. ("nginx page "):rep(300) .. "'; }",
                "  location = /hello { return 200 'nginx hello'; }",
                "  location = /moved { return 301 /hello; }",
                "}",
            }, "\n")
        end)
    end)

    teardown(function()
        if cli then cli:stop() end
        if up then up:stop() end
        if ngx then nginx.stop(ngx) end
        if broken then stop_broken(broken) end
        if certdir then os.execute("rm -rf " .. server.sh_quote(certdir)) end
    end)

    describe("against khamsin", function()
        it("HTTP/1.1 cleartext GET", function()
            local r = do_req { url = up_url("/hello") }
            assert.are.same({ 200, "hello", "1.1" }, { r.status, r.body, r.version })
        end)

        it("HTTP/1.1 over TLS (ALPN http/1.1 only), verified against the spec's CA", function()
            local r = do_req { url = up_url("/hello", true), cafile = certdir .. "/cert.pem",
                http2 = false }
            assert.are.same({ 200, "hello", "1.1" }, { r.status, r.body, r.version })
        end)

        it("HTTP/2 over TLS when ALPN picks h2", function()
            local r = do_req { url = up_url("/hello", true), cafile = certdir .. "/cert.pem" }
            assert.are.same({ 200, "hello", "2" }, { r.status, r.body, r.version })
        end)

        it("HTTP/2 over cleartext with prior knowledge (h2c = true)", function()
            local r = do_req { url = up_url("/hello"), h2c = true }
            assert.are.same({ 200, "hello", "2" }, { r.status, r.body, r.version })
            r = do_req { url = up_url("/echo"), h2c = true, method = "POST", body = "x" }
            assert.are.same({ "POST:x", "2" }, { r.body, r.version })
            local b = call("/seq", { url = up_url("/hello"), n = 5, h2c = true })
            assert.are.same({ "hello", "hello", "hello", "hello", "hello" }, b)
        end)

        it("1 MiB body over h1, h1+TLS and h2", function()
            for _, c in ipairs {
                { up_url("/big"), nil, "1.1" },
                { up_url("/big", true), false, "1.1" },
                { up_url("/big", true), true, "2" },
            } do
                local r = do_req { url = c[1], cafile = certdir .. "/cert.pem", http2 = c[2] }
                assert.are.same({ 200, 1048576, c[3] }, { r.status, r.body_len, r.version })
                assert.are.equal(("0123456789abcdef"):rep(4), r.body)
            end
        end)

        it("POST and PUT bodies, request headers, default User-Agent", function()
            for _, h2 in ipairs { false, true } do
                local url = up_url("/echo", h2)
                local r = do_req { url = url, method = "POST", body = "payload",
                    cafile = certdir .. "/cert.pem" }
                assert.are.equal("POST:payload", r.body)
                r = do_req { url = url, method = "PUT", body = ("z"):rep(100000),
                    cafile = certdir .. "/cert.pem" }
                assert.are.equal(100004, r.body_len)
                r = do_req { url = up_url("/hdr", h2), headers = { ["X-Test"] = "yes" },
                    cafile = certdir .. "/cert.pem" }
                assert.are.equal("yes|khamsin", r.body)
            end
        end)

        it("status without a body (204) and case-insensitive response headers", function()
            local r = do_req { url = up_url("/status/204") }
            assert.are.same({ 204, "" }, { r.status, r.body })
            r = do_req { url = up_url("/hello"), want_header = "CONTENT-type" }
            assert.is_truthy(r.header:find("text/plain", 1, true))
            r = do_req { url = up_url("/hello", true), cafile = certdir .. "/cert.pem",
                want_header = "Content-Type" }
            assert.are.same({ "2", true }, { r.version, r.header:find("text/plain", 1, true) ~= nil })
        end)

        it("keep-alive: sequential requests reuse one connection (h1 and h2)", function()
            -- the upstream's log would need a connection id; the broken server's echo mode
            -- counts requests per connection instead (below). Here: they all succeed.
            local b = call("/seq", { url = up_url("/hello"), n = 20 })
            for i = 1, 20 do assert.are.equal("hello", b[i]) end
            b = call("/seq", { url = up_url("/hello", true), n = 20,
                cafile = certdir .. "/cert.pem" })
            for i = 1, 20 do assert.are.equal("hello", b[i]) end
        end)

        it("streamed body through res:reader()", function()
            local r = call("/stream", { url = up_url("/big") })
            assert.are.same({ 200, 1048576, true }, { r.status, r.len, r.body_nil })
            assert.is_true(r.chunks > 1)
            r = call("/stream", { url = up_url("/big", true), cafile = certdir .. "/cert.pem" })
            assert.are.same({ 200, 1048576 }, { r.status, r.len })
        end)

        it("certificate checked against the system store by default", function()
            local r = do_req { url = up_url("/hello", true) }
            assert.is_truthy(r.err:match("^tls: certificate verify failed: "), r.err)
        end)

        it("verify = false skips the check", function()
            local r = do_req { url = up_url("/hello", true), verify = false }
            assert.are.equal("hello", r.body)
        end)

        it("timeout over h1 and h2: 'timeout' within the deadline", function()
            local r = do_req { url = up_url("/slow"), timeout = 0.5 }
            assert.are.equal("timeout", r.err)
            assert.is_true(r.took < 1.5, r.took)
            r = do_req { url = up_url("/slow", true), timeout = 0.5,
                cafile = certdir .. "/cert.pem" }
            assert.are.equal("timeout", r.err)
        end)
    end)

    describe("against nginx", function()
        it("GET, keep-alive reuse, gzip decoding and redirects", function()
            local base = "http://127.0.0.1:" .. ngx.port
            local r = do_req { url = base .. "/hello" }
            assert.are.same({ 200, "nginx hello" }, { r.status, r.body })
            r = do_req { url = base .. "/page.txt", want_header = "content-encoding" }
            assert.are.same({ 200, ("nginx page "):rep(300), "gzip", "gzip" },
                { r.status, r.body, r.decoded, r.header })
            r = do_req { url = base .. "/page.txt", decode = false,
                headers = { ["Accept-Encoding"] = "gzip" } }
            assert.is_true(r.body_len < 3300, r.body_len)
            r = do_req { url = base .. "/moved" }
            assert.are.same({ 200, "nginx hello", base .. "/hello" }, { r.status, r.body, r.url })
            local b = call("/seq", { url = base .. "/hello", n = 10 })
            for i = 1, 10 do assert.are.equal("nginx hello", b[i]) end
        end)
    end)

    describe("against a broken server", function()
        it("closes mid-body (Content-Length not reached): 'closed mid-body'", function()
            assert.are.equal("closed mid-body", do_req { url = B("midbody") }.err)
        end)

        it("closes before the last chunk: 'closed mid-body'", function()
            assert.are.equal("closed mid-body", do_req { url = B("chunkcut") }.err)
        end)

        it("sends more than its Content-Length: the body stops there, the connection is not reused",
            function()
                local b = call("/seq", { url = B("clmore"), n = 3 })
                assert.are.same({ "01234", "01234", "01234" }, b)
            end)

        it("never answers: 'timeout' at the timeout", function()
            local r = do_req { url = B("mute"), timeout = 0.5 }
            assert.are.equal("timeout", r.err)
            assert.is_true(r.took >= 0.4 and r.took < 2, r.took)
            r = do_req { url = B("mute"), read_timeout = 0.3, timeout = 20 }
            assert.are.equal("timeout", r.err)
            assert.is_true(r.took < 2, r.took)
        end)

        it("resets the connection: 'connection reset by peer'", function()
            assert.are.equal("connection reset by peer", do_req { url = B("reset") }.err)
        end)

        it("closes without a byte: 'closed before response'", function()
            assert.are.equal("closed before response", do_req { url = B("early") }.err)
        end)

        it("bad chunk size: 'bad chunked encoding'", function()
            assert.are.equal("bad chunked encoding", do_req { url = B("badchunk") }.err)
        end)

        it("Content-Length with Transfer-Encoding: refused", function()
            assert.are.equal("ambiguous framing (Content-Length / Transfer-Encoding)",
                do_req { url = B("cltete") }.err)
        end)

        it("a body that trickles: read_timeout between bytes passes, timeout for the whole cuts",
            function()
                local r = do_req { url = B("slowbody"), read_timeout = 2, timeout = 20 }
                assert.are.same({ 200, "xxxxxxxxxx" }, { r.status, r.body })
                r = do_req { url = B("slowbody"), timeout = 1 }
                assert.are.equal("timeout", r.err)
                r = do_req { url = B("slowbody"), read_timeout = 0.1, timeout = 20 }
                assert.are.equal("timeout", r.err)
            end)

        it("gzip and zstd bodies are decoded; corrupt gzip, a pre-1.0 zstd frame and a gzip bomb fail", function()
            local r = do_req { url = B("gzip") }
            assert.are.same({ ("hello gzip"):rep(100), "gzip" }, { r.body, r.decoded })
            r = do_req { url = B("zstd") }
            assert.are.same({ ("hello zstd"):rep(100), "zstd" }, { r.body, r.decoded })
            assert.are.equal("corrupt compressed body", do_req { url = B("gzipbad") }.err)
            assert.are.equal("corrupt compressed body", do_req { url = B("zstdold") }.err)
            assert.are.equal("response body too large",
                do_req { url = B("bomb"), max_body = 1048576 }.err)
        end)

        it("max_body: 'response body too large'", function()
            local r = do_req { url = up_url("/big"), max_body = 1000 }
            assert.are.equal("response body too large", r.err)
        end)

        it("redirects: followed up to the limit, then 'too many redirects'", function()
            local r = do_req { url = B("redirect", "/r/3") }
            assert.are.same({ 200, "auth=- cookie=- method=GET body=-" }, { r.status, r.body })
            assert.are.equal("too many redirects", do_req { url = B("redirect", "/loop") }.err)
            r = do_req { url = B("redirect", "/r/3"), redirects = 2 }
            assert.are.equal("too many redirects", r.err)
            r = do_req { url = B("redirect", "/r/1"), redirects = 0 }
            assert.are.equal(302, r.status)
        end)

        it("credentials follow a redirect on the same origin only", function()
            local h = { Authorization = "Bearer s3cret", Cookie = "a=1" }
            local r = do_req { url = B("redirect", "/r/1"), headers = h }
            assert.are.equal("auth=Bearer s3cret cookie=a=1 method=GET body=-", r.body)
            -- another port is another origin: the credentials stay behind
            r = do_req { url = B("redirect", "/cross?to=" .. broken.ports.redirect2), headers = h }
            assert.are.equal("auth=- cookie=- method=GET body=-", r.body)
            -- and come back on the way to the same origin
            r = do_req { url = B("redirect", "/cross?to=" .. broken.ports.redirect), headers = h }
            assert.are.equal("auth=Bearer s3cret cookie=a=1 method=GET body=-", r.body)
        end)

        it("303 turns POST into GET without the body; 307 keeps both", function()
            local r = do_req { url = B("redirect", "/post303"), method = "POST", body = "b" }
            assert.are.equal("auth=- cookie=- method=GET body=-", r.body)
            r = do_req { url = B("redirect", "/post307"), method = "POST", body = "b" }
            assert.are.equal("method=POST body=b", r.body)
        end)

        it("keep-alive: one connection carries sequential requests", function()
            local b = call("/seq", { url = B("echo", "/x"), n = 5 })
            assert.are.same({ "GET /x 1", "GET /x 2", "GET /x 3", "GET /x 4", "GET /x 5" }, b)
        end)

        it("connection refused", function()
            local s = require("socket").bind("127.0.0.1", 0)
            local _, port = s:getsockname()
            s:close()
            assert.are.equal("connection refused",
                do_req { url = "http://127.0.0.1:" .. port .. "/" }.err)
        end)

        it("bad URLs return nil, reason; misuse raises", function()
            assert.are.equal("unsupported url scheme: ftp", do_req { url = "ftp://x/" }.err)
            assert.are.equal("invalid url: nope", do_req { url = "nope" }.err)
            local res = cli:request { path = "/misuse?h1=" .. up_url("/hdr") .. "&h2="
                .. up_url("/hdr", true) .. "&ca=" .. certdir .. "/cert.pem" }
            local t = cjson.decode(res.body)
            assert.is_false(t.ok)
            assert.is_truthy(t.e:find("url must be a string", 1, true), t.e)
            assert.is_truthy(t.e:find("app.lua:%d+:"), t.e)
            assert.is_false(t.ok2)
            assert.is_truthy(t.e2:find("opts must be a table", 1, true), t.e2)
            -- header injection refused over HTTP/1.1 and HTTP/2 alike
            for i = 1, 2 do
                assert.is_false(t.inj[i].ok)
                assert.is_truthy(t.inj[i].e:find("invalid request: bad header value", 1, true),
                    t.inj[i].e)
            end
        end)

        it("a client that leaves ends the wait: the upstream connection closes", function()
            local res = cli:request { path = "/leave?port=" .. broken.ports.watch, timeout = 1 }
            assert.is_not.equal(200, res.status)
            local closed = server.wait_until(10, function()
                return (server.read_file(broken.dir .. "/events") or ""):find("watch-closed", 1, true)
            end, 0.05)
            assert.is_truthy(closed, "the upstream connection stayed open after the client left")
            assert.are.equal("hello", do_req { url = up_url("/hello") }.body)
        end)
    end)
end)
