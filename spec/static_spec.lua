-- k.static(prefix, dir, opts) over h1, h1+tls, h2c and h2: Content-Type by extension, ETag and
-- Last-Modified with 304, single ranges (206/416; several ranges: the whole file), index files,
-- precompressed siblings by Accept-Encoding with Vary, HEAD, and the traversal payloads we know
-- (raw and encoded ../, %2e%2e, %252e, //, backslashes, overlong UTF-8, NUL, a symlink out of
-- the root, dotfiles): none may reach a file outside dir.
local server = require "helpers.server"

local base, root
local function sh(cmd) assert(os.execute(cmd) == 0 or true) end

local APP = [[
local k = require "khamsin"
local root = os.getenv("KH_STATIC_ROOT")
k.static("/static", root)
k.static("/site", root, { index = "index.html", cache_control = "max-age=60" })
k.static("/follow", root, { follow_symlinks = true })
k.static("/dots", root, { dotfiles = true })
k.get("/misuse", function()
    local ok, e = pcall(k.static, "/late", root)
    return tostring(ok) .. " " .. tostring(e)
end)
]]

local SECRET = "TOP-SECRET-OUTSIDE"

describe("k.static", function()
    local srv, big
    setup(function()
        base = os.tmpname()
        os.remove(base)
        root = base .. "/root"
        sh("mkdir -p " .. root .. "/sub " .. base .. "/root-secret " .. base .. "/outside")
        server.write_file(root .. "/hello.txt", "hello")
        server.write_file(root .. "/sub/index.html", "<h1>index</h1>")
        server.write_file(root .. "/.secret", "dotfile")
        server.write_file(root .. "/style.css", "body{}")
        server.write_file(root .. "/style.css.gz", "GZ-BYTES")
        server.write_file(root .. "/style.css.br", "BR-BYTES")
        server.write_file(root .. "/app.js", "1")
        server.write_file(root .. "/image.PNG", "\137PNG")
        server.write_file(root .. "/noext", "x")
        server.write_file(base .. "/secret.txt", SECRET)
        server.write_file(base .. "/root-secret/secret.txt", SECRET)
        server.write_file(base .. "/outside/secret.txt", SECRET)
        sh("ln -s ../outside/secret.txt " .. root .. "/link_out")
        sh("ln -s hello.txt " .. root .. "/link_in")
        sh("ln -s ../outside " .. root .. "/dir_out")
        local t = {}
        for i = 1, 1024 * 1024 / 16 do t[i] = string.format("%015d\n", i) end
        big = table.concat(t)
        server.write_file(root .. "/big.bin", big)
        srv = server.start { app = APP, env = { KH_STATIC_ROOT = root } }
    end)
    teardown(function()
        if srv then srv:stop() end
        if base then os.execute("rm -rf " .. base) end
    end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function get(path, headers, method)
                return srv:request { proto = proto, path = path, headers = headers, method = method }
            end

            it("serves a file with its type, ETag and Last-Modified", function()
                local r = get("/static/hello.txt")
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                assert.are.equal("text/plain; charset=utf-8", r.headers["content-type"])
                assert.truthy(r.headers["etag"]:match('^"%x+%-%x+"$'), r.headers["etag"])
                assert.is_true(server.is_http_date(r.headers["last-modified"]))
                assert.are.equal("bytes", r.headers["accept-ranges"])
                assert.are.equal("text/javascript; charset=utf-8", get("/static/app.js").headers["content-type"])
                assert.are.equal("image/png", get("/static/image.PNG").headers["content-type"])
                assert.are.equal("application/octet-stream", get("/static/noext").headers["content-type"])
                assert.are.equal("hello", get("/static/link_in").body) -- a link inside the root
            end)

            it("answers 304 to If-None-Match and If-Modified-Since", function()
                local r = get("/static/hello.txt")
                local etag, lm = r.headers["etag"], r.headers["last-modified"]
                local c = get("/static/hello.txt", { ["If-None-Match"] = etag })
                assert.are.equal(304, c.status)
                assert.are.equal("", c.body)
                assert.are.equal(etag, c.headers["etag"])
                assert.are.equal(304, get("/static/hello.txt", { ["If-None-Match"] = '"x", ' .. etag }).status)
                assert.are.equal(200, get("/static/hello.txt", { ["If-None-Match"] = '"other"' }).status)
                assert.are.equal(304, get("/static/hello.txt", { ["If-Modified-Since"] = lm }).status)
                assert.are.equal(200, get("/static/hello.txt", { ["If-Modified-Since"] = "Sun, 06 Nov 1994 08:49:37 GMT" }).status)
                -- If-None-Match wins over If-Modified-Since
                assert.are.equal(200, get("/static/hello.txt", { ["If-None-Match"] = '"other"', ["If-Modified-Since"] = lm }).status)
            end)

            it("answers one range with 206, 416 past the end, the whole file for several", function()
                local r = get("/static/hello.txt", { Range = "bytes=1-2" })
                assert.are.equal(206, r.status)
                assert.are.equal("el", r.body)
                assert.are.equal("bytes 1-2/5", r.headers["content-range"])
                r = get("/static/hello.txt", { Range = "bytes=-3" })
                assert.are.equal(206, r.status)
                assert.are.equal("llo", r.body)
                r = get("/static/hello.txt", { Range = "bytes=3-100" })
                assert.are.equal("lo", r.body)
                assert.are.equal("bytes 3-4/5", r.headers["content-range"])
                r = get("/static/hello.txt", { Range = "bytes=5-" })
                assert.are.equal(416, r.status)
                assert.are.equal("bytes */5", r.headers["content-range"])
                r = get("/static/hello.txt", { Range = "bytes=0-0,2-3" })
                assert.are.equal(200, r.status)
                assert.are.equal("hello", r.body)
                r = get("/static/hello.txt", { Range = "bytes=1-2", ["If-Range"] = '"stale"' })
                assert.are.equal(200, r.status)
                r = get("/static/big.bin", { Range = "bytes=1000000-1000015" })
                assert.are.equal(206, r.status)
                assert.are.equal(big:sub(1000001, 1000016), r.body)
            end)

            it("serves index files only with opts.index", function()
                local r = get("/site/sub/")
                assert.are.equal(200, r.status)
                assert.are.equal("<h1>index</h1>", r.body)
                assert.are.equal("text/html; charset=utf-8", r.headers["content-type"])
                assert.are.equal("max-age=60", r.headers["cache-control"])
                assert.are.equal(404, get("/static/sub/").status)
            end)

            it("picks a precompressed sibling by Accept-Encoding, with Vary", function()
                local r = get("/static/style.css", { ["Accept-Encoding"] = "gzip, br" })
                assert.are.equal("BR-BYTES", r.body)
                assert.are.equal("br", r.headers["content-encoding"])
                assert.are.equal("text/css; charset=utf-8", r.headers["content-type"])
                assert.are.equal("Accept-Encoding", r.headers["vary"])
                r = get("/static/style.css", { ["Accept-Encoding"] = "gzip, br;q=0" })
                assert.are.equal("GZ-BYTES", r.body)
                assert.are.equal("gzip", r.headers["content-encoding"])
                r = get("/static/style.css", { ["Accept-Encoding"] = "identity" })
                assert.are.equal("body{}", r.body)
                assert.is_nil(r.headers["content-encoding"])
                assert.are.equal("Accept-Encoding", r.headers["vary"])
            end)

            it("serves a 1 MB file whole, and HEAD with its length", function()
                local r = get("/static/big.bin")
                assert.are.equal(200, r.status)
                assert.are.equal(#big, #r.body)
                assert.is_true(r.body == big)
                r = get("/static/big.bin", nil, "HEAD")
                assert.are.equal(200, r.status)
                assert.are.equal(tostring(#big), r.headers["content-length"])
            end)

            -- the path checks do not depend on TLS: h1 and h2c carry the payloads
            if proto == "h1" or proto == "h2c" then it("never leaves dir: traversal payloads, symlinks out, dotfiles", function()
                local payloads = {
                    "/static/../secret.txt", "/static/..%2fsecret.txt", "/static/..%2Fsecret.txt",
                    "/static/%2e%2e/secret.txt", "/static/%2e%2e%2fsecret.txt", "/static/.%2e/secret.txt",
                    "/static/%252e%252e/secret.txt", "/static/%252e%252e%252fsecret.txt",
                    "/static/..%252fsecret.txt", "/static//../secret.txt", "/static/sub/../../secret.txt",
                    "/static/sub/..%2f..%2fsecret.txt", "/static/..\\secret.txt", "/static/..%5csecret.txt",
                    "/static/%5c..%5csecret.txt", "/static/%c0%ae%c0%ae/secret.txt",
                    "/static/%c0%ae%c0%ae%c0%afsecret.txt", "/static/%e0%80%ae%e0%80%ae/secret.txt",
                    "/static/hello.txt%00.png", "/static/%00", "/static/..%00/secret.txt",
                    "/static/link_out", "/static/dir_out/secret.txt", "/static/.secret",
                    "/static/%2esecret", "/static/sub/.%2e/.%2e/secret.txt",
                    "/static/../root-secret/secret.txt", "/static/..%2froot-secret%2fsecret.txt",
                    "/static/" .. root .. "/../secret.txt", "/static//" .. base .. "/secret.txt",
                    "/static/%2f" .. base:sub(2) .. "/secret.txt",
                }
                for _, p in ipairs(payloads) do
                    local r = get(p)
                    assert.truthy(r.status == 400 or r.status == 404, p .. " -> " .. tostring(r.status))
                    assert.falsy(r.body:find(SECRET, 1, true), p)
                end
                -- allowed on purpose: a route with follow_symlinks, one with dotfiles
                assert.are.equal(SECRET, get("/follow/link_out").body)
                assert.are.equal("dotfile", get("/dots/.secret").body)
            end) end

            it("refuses k.static after load at the app's line", function()
                local r = get("/misuse")
                assert.truthy(r.body:find("^false [^ ]*app%.lua:%d+: "), r.body)
            end)
        end)
    end)
end)
