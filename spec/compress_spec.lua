-- Compression (limit compress=1): zstd, br or gzip by Accept-Encoding with q-values (q=0
-- refuses, ties go zstd > br > gzip), only above compress_min_bytes and for compressible types,
-- always with Vary: Accept-Encoding when the response qualifies; never twice, never over the
-- app's own Content-Encoding, never for 204/304/HEAD/206. Decoded with curl --compressed and
-- independent decoders (python3 zlib and brotli, the zstd command), over h1 and h2.
-- Streaming (a flush per write): res:write and SSE replies are compressed as they go (the C unit
-- test core/test/test_compress.c checks each flush decodes to everything written so far; the
-- last describe here checks it end to end with curl).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local items = {}
for i = 1, 200 do items[i] = { id = i, name = "item number " .. i, tags = { "a", "b" } } end
local html = ("<p>hello compressible world</p>\n"):rep(100)
k.get("/json", function() return { items = items } end)
k.get("/html", function(req, res)
    res.headers["Content-Type"] = "text/html; charset=utf-8"
    return html
end)
k.get("/small", function(req, res) return "tiny" end)
k.get("/png", function(req, res)
    res.headers["Content-Type"] = "image/png"
    return html
end)
k.get("/precoded", function(req, res)
    res.headers["Content-Type"] = "text/plain"
    res.headers["Content-Encoding"] = "gzip"
    return "not really gzip but the app says so" .. ("."):rep(2000)
end)
k.get("/nocontent", function() return 204 end)
k.get("/range", function(req, res)
    res.headers["Content-Range"] = "bytes 0-2047/9999"
    return 206, html:sub(1, 2048)
end)
k.get("/etag", function(req, res) res:etag("e1"); return html end)
k.get("/write", function(req, res)
    res.headers["Content-Type"] = "text/plain"
    for i = 1, 50 do
        assert(res:write(("line %d of a streamed compressible reply\n"):format(i):rep(20)))
        if i % 10 == 0 then k.sleep(0.01) end
    end
end)
k.get("/sse", function(req, res)
    local sse = res:sse()
    sse:send{event = "first", data = "one"}
    k.sleep(30)
end)
]]

local PY = "/usr/bin/python3"

local function decode(kind, data)
    local dir = os.tmpname()
    local f = assert(io.open(dir, "wb")); f:write(data); f:close()
    local cmd
    if kind == "gzip" then
        cmd = PY .. [[ -c "import sys,zlib; sys.stdout.buffer.write(zlib.decompress(open(sys.argv[1],'rb').read(), 31))" ]] .. dir
    elseif kind == "br" then
        cmd = PY .. [[ -c "import sys,brotli; sys.stdout.buffer.write(brotli.decompress(open(sys.argv[1],'rb').read()))" ]] .. dir
    else
        cmd = "zstd -q -d -c " .. dir
    end
    local p = io.popen(cmd .. " 2>&1")
    local out = p:read("*a")
    p:close()
    os.remove(dir)
    return out
end

describe("compression", function()
    local srv, plain
    setup(function()
        srv = server.start { app = APP, args = { "--limit", "compress=1" } }
        plain = {}
        for _, path in ipairs { "/json", "/html" } do plain[path] = srv:request { path = path }.body end
    end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function req(path, ae, o)
                o = o or {}
                o.proto, o.path = proto, path
                o.headers = o.headers or {}
                if ae then o.headers["Accept-Encoding"] = ae end
                return srv:request(o)
            end

            it("decodes with curl --compressed to the same body", function()
                for _, path in ipairs { "/json", "/html" } do
                    local r = req(path, nil, { curl_args = { "--compressed" } })
                    assert.are.equal(200, r.status)
                    assert.truthy(r.headers["content-encoding"], path)
                    assert.are.equal(plain[path], r.body)
                end
            end)

            it("picks the coding by q-value, decodable by independent decoders", function()
                local cases = {
                    { "gzip", "gzip" }, { "br", "br" }, { "zstd", "zstd" },
                    { "gzip, deflate, br, zstd", "zstd" },
                    { "gzip;q=0.5, br;q=0.8", "br" },
                    { "zstd;q=0, *", "br" },
                    { "gzip;q=1.0, br;q=0.999", "gzip" },
                    { "x-gzip", "gzip" },
                    { "GZIP", "gzip" },
                }
                for _, c in ipairs(cases) do
                    local r = req("/json", c[1])
                    assert.are.equal(200, r.status)
                    assert.are.equal(c[2], r.headers["content-encoding"], c[1])
                    assert.truthy(r.headers["vary"]:lower():find("accept-encoding", 1, true))
                    assert.truthy(#r.body < #plain["/json"] / 3, c[1])
                    assert.are.equal(tonumber(r.headers["content-length"]) or #r.body, #r.body)
                    assert.are.equal(plain["/json"], decode(c[2], r.body), c[1])
                end
            end)

            it("sends identity (with Vary) when every coding is refused or none is asked", function()
                for _, ae in ipairs { "gzip;q=0", "identity", "br;q=0, zstd;q=0, gzip;q=0", "*;q=0", "deflate", "" } do
                    local r = req("/html", ae)
                    assert.is_nil(r.headers["content-encoding"], ae)
                    assert.are.equal(plain["/html"], r.body)
                    assert.truthy(r.headers["vary"]:lower():find("accept-encoding", 1, true), ae)
                end
                local r = req("/html")
                assert.is_nil(r.headers["content-encoding"])
            end)

            it("never compresses small bodies, other types, coded, 204, 206 or HEAD replies", function()
                local function identity(path, o)
                    local r = req(path, "gzip, br, zstd", o)
                    assert.is_nil(r.headers["content-encoding"], path)
                    return r
                end
                local r = identity("/small")
                assert.are.equal("tiny", r.body)
                assert.is_nil(r.headers["vary"])
                r = identity("/png")
                assert.is_nil(r.headers["vary"])
                r = req("/precoded", "gzip, br, zstd")
                assert.are.equal("gzip", r.headers["content-encoding"]) -- the app's own, once
                assert.truthy(r.body:find("^not really gzip"))
                r = identity("/nocontent")
                assert.are.equal(204, r.status)
                r = identity("/range")
                assert.are.equal(206, r.status)
                assert.are.equal(2048, #r.body)
                r = req("/html", "gzip", { method = "HEAD" })
                assert.are.equal(200, r.status)
                assert.is_nil(r.headers["content-encoding"])
            end)

            it("answers 304 without a body, keeping Vary", function()
                local r = req("/etag", "gzip", { headers = { ["If-None-Match"] = '"e1"' } })
                assert.are.equal(304, r.status)
                assert.are.equal("", r.body)
                assert.is_nil(r.headers["content-encoding"])
                assert.truthy(r.headers["vary"]:lower():find("accept-encoding", 1, true))
            end)
        end)
    end)
end)

describe("compression off (the default)", function()
    local srv
    setup(function() srv = server.start { app = APP } end)
    teardown(function() if srv then srv:stop() end end)
    it("sends identity whatever the client accepts", function()
        local r = srv:request { path = "/json", headers = { ["Accept-Encoding"] = "gzip, br, zstd" } }
        assert.are.equal(200, r.status)
        assert.is_nil(r.headers["content-encoding"])
        assert.is_nil(r.headers["vary"])
    end)
end)

describe("compression of streamed replies", function()
    local srv
    setup(function() srv = server.start { app = APP, args = { "--limit", "compress=1" } } end)
    teardown(function() if srv then srv:stop() end end)
    local want = {}
    for i = 1, 50 do want[#want + 1] = ("line %d of a streamed compressible reply\n"):format(i):rep(20) end
    want = table.concat(want)
    for _, p in ipairs { { "h1", "--http1.1" }, { "h2c", "--http2-prior-knowledge" } } do
        it("res:write chunks decode to the whole body, each coding (" .. p[1] .. ")", function()
            for _, coding in ipairs { "gzip", "br", "zstd" } do
                local out = os.tmpname()
                local hdr = os.tmpname()
                os.execute("curl -s " .. p[2] .. " -H 'Accept-Encoding: " .. coding .. "' -D " .. hdr
                    .. " -o " .. out .. " --max-time 20 " .. server.sh_quote(srv:url("/write")))
                local h = server.read_file(hdr) or ""
                local body = server.read_file(out) or ""
                os.remove(out); os.remove(hdr)
                assert.truthy(h:lower():find("content-encoding: " .. coding, 1, true), coding .. ": " .. h)
                assert.truthy(#body < #want / 4, coding)
                assert.are.equal(want, decode(coding, body), coding)
            end
        end)
        it("an SSE event is flushed compressed before the stream ends (" .. p[1] .. ")", function()
            local out = os.tmpname()
            local t0 = os.time()
            -- curl decodes as bytes arrive; without a flush per write nothing would decode
            local hdr = os.tmpname()
            os.execute("curl -s -N --compressed " .. p[2] .. " --max-time 4 -D " .. hdr .. " -o " .. out
                .. " " .. server.sh_quote(srv:url("/sse")) .. " >/dev/null 2>&1")
            local body = server.read_file(out) or ""
            local h = (server.read_file(hdr) or ""):lower()
            os.remove(out); os.remove(hdr)
            assert.truthy(h:find("content%-encoding: [a-z]+"), h)
            assert.truthy(os.time() - t0 < 15)
            assert.truthy(body:find("event: first\ndata: one\n\n", 1, true), body)
        end)
    end
end)
