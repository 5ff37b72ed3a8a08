-- spec/h2_spec.lua: HTTP/2 (RFC 9113) over cleartext: prior knowledge, Upgrade: h2c (with
-- --h2c-upgrade 1; the rest of h2c Upgrade is in spec/h2c_upgrade_spec.lua), the same
-- handlers as HTTP/1.1, large bodies both ways, concurrency, GOAWAY on SIGTERM, peer resets.
-- Clients: curl --http2-prior-knowledge / --http2, nghttp, h2load, python3-h2 (spec/h2/client.py).
local server = require "spec.helpers.server"
local cjson = require "cjson"

local PY = "/usr/bin/python3"
local CLIENT = server.root .. "/spec/h2/client.py"

local APP = [[
local k = require "khamsin"
k.get("/", function() return "Hello, World!" end)
k.get("/users/:id", function(req)
    return { id = req.params.id, query = req.query, version = req.version, host = req.headers.host,
             cookie = req.headers.cookie, method = req.method, path = req.path }
end)
k.post("/echo", function(req, res)
    res.headers["content-type"] = req.headers["content-type"] or "application/octet-stream"
    return 201, req:body()
end)
k.post("/json", function(req) local t = req:json(); return { got = t.a } end)
k.get("/big", function(req) return string.rep("0123456789", tonumber(req.args.n or 100000) / 10) end)
k.get("/grow", function(req, res) -- writes in one slice: kh_h2's small body block, then its growth
    res:write(("a"):rep(10)); res:write(("b"):rep(400)); res:write(("c"):rep(100000)); res:write("dd")
end)
k.get("/fail", function() error("boom") end)
k.get("/teapot", function() k.fail(418, "short and stout") end)
k.put("/only-put", function() return "put" end)
k.post("/slow", function(req) return "got " .. req:body() end)
k.get("/sleepy", function(req)
    local ok, e = pcall(k.sleep, 5)
    k.log.info("sleepy handler: " .. (ok and "slept" or (k.is_aborted(e) and "aborted" or "error")))
    return "late"
end)
k.post("/wait", function(req)
    if req.args.mark then assert(io.open(req.args.mark, "w")):close() end -- "I wait for the body"
    local ok, e = pcall(req.body, req)
    k.log.info("wait handler: body " .. (ok and "read" or (k.is_aborted(e) and "aborted" or "error")))
    return "unreachable"
end)
]]

local function absent(v)
    return v == nil or v == cjson.null
end

local sh = require("spec.helpers.shell").run

local function py(srv, mode, ...)
    local args = { PY, CLIENT, mode, tostring(srv.port) }
    for _, a in ipairs { ... } do args[#args + 1] = server.sh_quote(a) end
    local out = sh("timeout 60 " .. table.concat(args, " "))
    local line = out:match("(%b{})%s*$")
    assert(line, "python client printed no JSON:\n" .. out)
    return cjson.decode(line)
end

describe("HTTP/2", function()
    local srv
    setup(function()
        srv = server.start { app = APP }
        srv:expect_error("handler error on GET /fail")
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    describe("curl --http2-prior-knowledge", function()
        local function req(t)
            t.proto = "h2c"
            return srv:request(t)
        end

        it("answers GET with the same head as HTTP/1.1", function()
            local r = req { path = "/" }
            assert.are.equal(200, r.status)
            assert.are.equal("2", r.version)
            assert.are.equal("Hello, World!", r.body)
            assert.are.equal("13", r.headers["content-length"])
            assert.are.equal("khamsin", r.headers.server)
            assert.is_true(server.is_http_date(r.headers.date))
            assert.truthy(r.headers["content-type"]:match("^text/plain"))
        end)

        it("sends a body written small then large in one slice, byte for byte", function()
            local r = req { path = "/grow" }
            assert.are.equal(200, r.status)
            assert.are.equal(("a"):rep(10) .. ("b"):rep(400) .. ("c"):rep(100000) .. "dd", r.body)
        end)

        it("passes params, query, method, path, host and a rejoined cookie", function()
            local r = req { path = "/users/42?a=1&b=2", headers = { { "Cookie", "x=1" }, { "Cookie", "y=2" } } }
            assert.are.equal(200, r.status)
            assert.truthy(r.headers["content-type"]:match("^application/json"))
            local t = cjson.decode(r.body)
            assert.are.equal("42", t.id)
            assert.are.equal("a=1&b=2", t.query)
            assert.are.equal("2.0", t.version)
            assert.are.equal("GET", t.method)
            assert.are.equal("/users/42", t.path)
            assert.are.equal("127.0.0.1:" .. srv.port, t.host)
            -- RFC 9113 §8.2.3: split cookie fields are joined with "; "
            assert.are.equal("x=1; y=2", t.cookie)
        end)

        it("echoes a POST body with its content type", function()
            local r = req { method = "POST", path = "/echo", body = "hello h2", headers = { ["Content-Type"] = "text/x-spec" } }
            assert.are.equal(201, r.status)
            assert.are.equal("hello h2", r.body)
            assert.are.equal("text/x-spec", r.headers["content-type"])
        end)

        it("decodes JSON bodies and answers 400 for bad JSON", function()
            local r = req { method = "POST", path = "/json", body = '{"a":7}' }
            assert.are.equal(200, r.status)
            assert.are.equal(7, cjson.decode(r.body).got)
            r = req { method = "POST", path = "/json", body = "{nope" }
            assert.are.equal(400, r.status)
        end)

        it("answers 404, 405 with Allow, 418 from k.fail and 500 from an error", function()
            assert.are.equal(404, req { path = "/nothing" }.status)
            local r = req { path = "/only-put" }
            assert.are.equal(405, r.status)
            assert.are.equal("PUT", r.headers.allow)
            assert.are.equal(418, req { path = "/teapot" }.status)
            assert.are.equal(500, req { path = "/fail" }.status)
        end)

        it("sends no body for HEAD but the GET's content-length", function()
            local r = req { method = "HEAD", path = "/" }
            assert.are.equal(200, r.status)
            assert.are.equal("13", r.headers["content-length"])
            assert.are.equal("", r.body)
        end)

        it("never sends connection-specific fields (RFC 9113 §8.2.2)", function()
            local r = req { path = "/" }
            assert.is_nil(r.headers.connection)
            assert.is_nil(r.headers["transfer-encoding"])
            assert.is_nil(r.headers["keep-alive"])
        end)

        it("answers 413 past body_bytes", function()
            local s2 = server.start { app = APP, args = { "--limit", "body_bytes=1024" } }
            local r = s2:request { proto = "h2c", method = "POST", path = "/echo", body = ("x"):rep(1025) }
            assert.are.equal(413, r.status)
            r = s2:request { proto = "h2c", method = "POST", path = "/echo", body = ("x"):rep(1024) }
            assert.are.equal(201, r.status)
            s2:stop()
        end)
    end)

    describe("entry points", function()
        it("upgrades HTTP/1.1 with Upgrade: h2c (curl --http2) when h2c_upgrade = 1, on stream 1", function()
            -- off by default (spec/h2c_upgrade_spec.lua)
            local s2 = server.start { app = APP, args = { "--h2c-upgrade", "1" } }
            local r = s2:request { proto = "h1", path = "/users/7?q=1", curl_args = { "--http2" } }
            assert.are.equal(200, r.status)
            assert.are.equal("2", r.version)
            local t = cjson.decode(r.body)
            assert.are.equal("7", t.id)
            assert.are.equal("2.0", t.version)
            -- then the same connection carries more requests over h2
            local out, code = sh("curl -s --http2 -o /dev/null -o /dev/null -w '%{http_version} %{http_code}\\n' "
                .. s2:url("/") .. " " .. s2:url("/users/1"))
            s2:stop()
            assert.are.equal(0, code)
            assert.are.equal("2 200\n2 200\n", out)
        end)

        it("takes the preface even when it arrives in pieces", function()
            local c = srv:raw_conn()
            c:send("PRI * HTTP/2.0\r\n")
            server.sleep(0.05)
            c:send("\r\nSM\r\n\r\n" .. string.char(0, 0, 0, 4, 0, 0, 0, 0, 0))
            local data = c:read_for(0.3)
            c:close()
            -- the server's SETTINGS frame: type 4 on stream 0
            assert.truthy(#data >= 9)
            assert.are.equal(4, data:byte(4))
        end)

        it("still refuses an HTTP/2 preface that is not at the start of a connection", function()
            local data = srv:raw("GET / HTTP/1.1\r\nHost: x\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", { timeout = 1 })
            local list = server.parse_responses(data)
            assert.are.equal(200, list[1].status)
            assert.truthy(list[2] and list[2].status >= 400)
        end)

        it("answers nghttp", function()
            local out, code = sh("timeout 10 nghttp " .. srv:url("/users/3"))
            assert.are.equal(0, code, out)
            assert.are.equal("3", cjson.decode(out).id)
            out, code = sh("timeout 10 nghttp -nv " .. srv:url("/"))
            assert.are.equal(0, code, out)
            assert.truthy(out:match("recv SETTINGS frame.-SETTINGS_MAX_CONCURRENT_STREAMS%(0x03%):100"))
            assert.truthy(out:match(":status: 200"))
        end)
    end)

    describe("over TLS (ALPN h2)", function()
        local function tls_url(path)
            local l = srv.tls_listens[1]
            return "https://" .. l.host .. ":" .. l.port .. path
        end

        it("curl --http2 negotiates h2 and the handler answers the same", function()
            local r = srv:request { proto = "h2", path = "/users/9?x=1" }
            assert.are.equal(200, r.status)
            assert.are.equal("2", r.version)
            local t = cjson.decode(r.body)
            assert.are.equal("9", t.id)
            assert.are.equal("2.0", t.version)
            r = srv:request { proto = "h2", method = "POST", path = "/echo", body = ("b"):rep(100000) }
            assert.are.equal(201, r.status)
            assert.are.equal(100000, #r.body)
        end)

        it("answers nghttp and h2load (2000 requests, 10 x 10, none failed)", function()
            -- (nghttp warns on stderr that the self-signed certificate does not verify)
            local out, code = sh("timeout 10 nghttp " .. tls_url("/users/4") .. " 2>/dev/null")
            assert.are.equal(0, code, out)
            assert.are.equal("4", cjson.decode(out:match("%b{}")).id)
            out = sh("timeout 60 h2load -n 2000 -c 10 -m 10 " .. tls_url("/"))
            assert.truthy(out:match("Application protocol: h2"), out)
            assert.truthy(out:match("2000 succeeded, 0 failed, 0 errored"), out)
        end)
    end)

    describe("python3-h2", function()
        it("advertises the limits in SETTINGS", function()
            local t = py(srv, "requests", '[{"path":"/"}]')
            assert.are.equal(100, t.settings["3"]) -- MAX_CONCURRENT_STREAMS
            assert.are.equal(262144, t.settings["4"]) -- INITIAL_WINDOW_SIZE: h2_stream_window
            assert.are.equal(16384, t.settings["6"]) -- MAX_HEADER_LIST_SIZE: header_bytes
        end)

        it("moves large bodies both ways through flow control", function()
            local t = py(srv, "requests", cjson.encode {
                { method = "POST", path = "/echo", body_len = 5 * 1024 * 1024 + 17 },
                { path = "/big?n=12000000" },
            })
            assert.are.equal(201, t.responses[1].status)
            assert.are.equal(5 * 1024 * 1024 + 17, t.responses[1].body_len)
            assert.is_true(t.responses[1].echo_ok)
            assert.are.equal(200, t.responses[2].status)
            assert.are.equal(12000000, t.responses[2].body_len)
        end)

        it("answers 413 and resets the rest of an upload past body_bytes, then serves on", function()
            local t = py(srv, "requests", cjson.encode {
                { method = "POST", path = "/echo", body_len = 9 * 1024 * 1024 },
                { path = "/" },
            })
            assert.are.equal(413, t.responses[1].status)
            assert.are.equal(0, t.responses[1].reset) -- RST_STREAM(NO_ERROR) after the answer
            assert.are.equal(200, t.responses[2].status)
        end)

        it("serves 100 concurrent streams on one connection", function()
            local reqs = {}
            for i = 1, 100 do reqs[i] = { path = "/users/" .. i } end
            local t = py(srv, "requests", cjson.encode(reqs))
            for i = 1, 100 do
                assert.are.equal(200, t.responses[i].status)
                assert.are.equal(tostring(i), cjson.decode(t.responses[i].body).id)
            end
        end)

        it("answers 431 to a header list over header_bytes and keeps the connection", function()
            local t = py(srv, "requests", cjson.encode {
                { path = "/", headers = { { "x-big", ("v"):rep(20000) } } },
                { path = "/" },
            })
            assert.are.equal(431, t.responses[1].status)
            assert.are.equal(200, t.responses[2].status)
            assert.is_true(absent(t.goaway))
        end)

        it("tells a handler waiting for the body that the peer reset its stream", function()
            local mark = srv:log_size()
            local t = py(srv, "rst_wait", srv.dir .. "/rst_wait.mark")
            assert.is_true(absent(t.first.status))
            assert.are.equal(200, t.second.status) -- the connection goes on
            assert.truthy(srv:wait_log("wait handler: body aborted", 5, mark), srv:log():sub(mark + 1)) -- a bound, polled
        end)
    end)

    it("answers a request whose client half-closed right after sending it", function()
        local t = py(srv, "halfclose")
        assert.are.equal(200, t.status)
        assert.are.equal(30000, t.body_len)
        assert.is_true(t.ended)
        assert.is_true(t.closed)
    end)

    it("aborts a handler that still works when its client leaves (FIN), as on HTTP/1.1", function()
        local mark = srv:log_size()
        py(srv, "leave", "/sleepy")
        assert.truthy(srv:wait_log("sleepy handler: aborted", 2, mark))
    end)

    it("h2load: 2000 requests over 10 connections x 10 streams, none failed", function()
        local out = sh("timeout 60 h2load -n 2000 -c 10 -m 10 " .. srv:url("/"))
        assert.truthy(out:match("requests: 2000 total, 2000 started, 2000 done, 2000 succeeded, 0 failed, 0 errored, 0 timeout"), out)
        assert.truthy(out:match("status codes: 2000 2xx"), out)
    end)

    it("sends GOAWAY(NO_ERROR) after an idle keepalive_timeout_ms", function()
        local s2 = server.start { app = APP, args = { "--limit", "keepalive_timeout_ms=300" } }
        local t = py(s2, "idle")
        assert.are.same({ code = 0, last_stream_id = 0 }, t.goaway)
        assert.is_true(t.closed)
        s2:stop()
    end)

    it("on SIGTERM sends GOAWAY, refuses new streams and completes the one in flight", function()
        local s2 = server.start { app = APP }
        local t = py(s2, "sigterm", s2.pid)
        assert.are.same({ code = "NO_ERROR", last_stream_id = 1 }, t.goaway)
        assert.are.equal(200, t.response.status)
        assert.are.equal("got in flight", t.response.body)
        assert.is_true(t.late_refused)
        assert.is_true(t.closed)
        assert.are.equal(0, s2:wait_exit(5))
        s2:stop()
    end)

    it("honours --limit h2_max_concurrent_streams", function()
        local s2 = server.start { app = APP, args = { "--limit", "h2_max_concurrent_streams=7" } }
        local t = py(s2, "requests", '[{"path":"/"}]')
        assert.are.equal(7, t.settings["3"])
        -- 7 streams waiting for their bodies at once are served
        t = py(s2, "concurrency", 7)
        assert.are.same({ 200, 200, 200 }, t.answered)
        assert.is_true(absent(t.goaway))
        -- an 8th after our SETTINGS were acknowledged breaks the limit the client knows:
        -- nghttp2 makes that a connection error (RFC 9113 §5.1.2 allows a stream error)
        t = py(s2, "concurrency", 8)
        assert.are.equal("PROTOCOL_ERROR", t.goaway.code)
        assert.are.equal(13, t.goaway.last_stream_id)
        s2:stop()
    end)
end)
