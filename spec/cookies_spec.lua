-- Cookies: req.cookies (RFC 6265 parsing, tolerant, first wins), res:set_cookie (one Set-Cookie
-- per call, several on one response over h1 and h2, invalid input refused at the app's line),
-- and k.sign / k.unsign (HMAC-SHA256, base64url; the C unit test has RFC 4231's vectors).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local KEY, OLD = "0123456789abcdef-current", "0123456789abcdef-previous"
local function dump(t)
    local keys = {}
    for name in pairs(t) do keys[#keys + 1] = name end
    table.sort(keys)
    for i, name in ipairs(keys) do keys[i] = name .. "=" .. t[name] end
    return table.concat(keys, "&")
end
k.get("/cookies", function(req) return dump(req.cookies) end)
k.get("/set", function(req, res)
    res:set_cookie("sid", "abc.123", { path = "/", domain = "example.com", max_age = 3600,
        expires = 1767225600, secure = true, http_only = true, same_site = "lax" })
    res:set_cookie("theme", "dark")
    res:set_cookie("gone", "", { max_age = 0 })
    return "ok"
end)
k.get("/set-with-header", function(req, res)
    res.headers["set-cookie"] = "first=1"
    res:set_cookie("second", "2")
    return 204
end)
k.get("/refuse/:what", function(req, res)
    local w = req.params.what
    local ok, e
    if w == "name" then ok, e = pcall(res.set_cookie, res, "bad name", "v")
    elseif w == "value" then ok, e = pcall(res.set_cookie, res, "n", "a;b")
    elseif w == "option" then ok, e = pcall(res.set_cookie, res, "n", "v", { maxage = 1 })
    elseif w == "samesite" then ok, e = pcall(res.set_cookie, res, "n", "v", { same_site = "None" })
    elseif w == "path" then ok, e = pcall(res.set_cookie, res, "n", "v", { path = "/a\r\nX: y" })
    elseif w == "key" then ok, e = pcall(k.sign, "short", "v")
    end
    return tostring(ok) .. " " .. tostring(e)
end)
k.get("/uncaught", function(req, res) res:set_cookie("n", "a b"); return "never" end)
k.get("/login", function(req, res)
    res:set_cookie("user", k.sign(KEY, req.args.name), { http_only = true })
    return "ok"
end)
k.get("/login-old", function(req, res)
    res:set_cookie("user", k.sign(OLD, req.args.name))
    return "ok"
end)
k.get("/whoami", function(req)
    local who = k.unsign({ KEY, OLD }, req.cookies.user)
    if not who then return 401, "who?" end
    return who
end)
k.get("/strict", function(req) return tostring(k.unsign(KEY, req.cookies.user)) end)
]]

local function set_cookies(r)
    local out = {}
    for _, h in ipairs(r.header_list) do
        if h[1] == "set-cookie" then out[#out + 1] = h[2] end
    end
    return out
end

describe("cookies", function()
    local srv
    setup(function()
        srv = server.start { app = APP, expect_errors = { "the value may hold printable ASCII" } }
    end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function get(path, headers)
                return srv:request { proto = proto, path = path, headers = headers }
            end

            it("parses the Cookie header leniently; the first of a repeated name wins", function()
                local r = get("/cookies", { Cookie = 'a=1; b="two";a=3;  c = x y ;bare; =e; d=; e=f=g' })
                assert.are.equal(200, r.status)
                assert.are.equal("a=1&b=two&c=x y&d=&e=f=g", r.body)
                assert.are.equal("", get("/cookies").body)
            end)

            it("joins several Cookie fields with '; '", function()
                local r = get("/cookies", { { "Cookie", "a=1" }, { "Cookie", "b=2; a=9" } })
                assert.are.equal("a=1&b=2", r.body)
            end)

            it("sends one Set-Cookie per res:set_cookie, with the attributes", function()
                local r = get("/set")
                assert.are.equal(200, r.status)
                assert.are.same({
                    "sid=abc.123; Path=/; Domain=example.com; Max-Age=3600; "
                        .. "Expires=Thu, 01 Jan 2026 00:00:00 GMT; Secure; HttpOnly; SameSite=Lax",
                    "theme=dark",
                    "gone=; Max-Age=0",
                }, set_cookies(r))
                r = get("/set-with-header")
                assert.are.equal(204, r.status)
                assert.are.same({ "first=1", "second=2" }, set_cookies(r))
            end)

            it("refuses invalid names, values and options at the app's line", function()
                local function refused(what, msg)
                    local body = get("/refuse/" .. what).body
                    assert.truthy(body:find("^false [^ ]*app%.lua:%d+: "), body)
                    assert.truthy(body:find(msg, 1, true), body)
                end
                refused("name", "the name must be a token")
                refused("value", "RFC 6265 cookie-octet")
                refused("option", 'unknown option "maxage"')
                refused("samesite", "needs secure = true")
                refused("path", "path must be a non-empty string without ';' or control bytes")
                refused("key", "at least 16 bytes")
                local r = get("/uncaught")
                assert.are.equal(500, r.status)
                assert.are.same({}, set_cookies(r))
            end)

            it("signs and checks cookies (k.sign / k.unsign), rotating keys", function()
                local r = get("/login?name=alice")
                local c = set_cookies(r)[1]
                local value = c:match("^user=([^;]+)")
                assert.truthy(value:find("^alice%.[%w_-]+$"), value)
                assert.are.equal(43, #value:match("%.(.*)$"))
                -- the signature is HMAC-SHA256(key, value) in base64url, as Python computes it
                local p = io.popen([[/usr/bin/python3 -c "import hmac,hashlib,base64;print(base64.urlsafe_b64encode(hmac.new(b'0123456789abcdef-current',b'alice',hashlib.sha256).digest()).rstrip(b'=').decode())"]])
                local want = p:read("*l")
                p:close()
                assert.are.equal("alice." .. want, value)
                assert.are.equal("alice", get("/whoami", { Cookie = "user=" .. value }).body)
                -- tampered value, tampered signature, no signature, no cookie
                local sig = value:match("%.(.*)$")
                assert.are.equal(401, get("/whoami", { Cookie = "user=mallory." .. sig }).status)
                local flipped = sig:sub(1, 42) .. (sig:sub(43) == "A" and "B" or "A")
                assert.are.equal(401, get("/whoami", { Cookie = "user=alice." .. flipped }).status)
                assert.are.equal(401, get("/whoami", { Cookie = "user=alice" }).status)
                assert.are.equal(401, get("/whoami").status)
                -- signed with the previous key: accepted by the list, not by the current key alone
                local old = set_cookies(get("/login-old?name=bob"))[1]:match("^user=([^;]+)")
                assert.are.equal("bob", get("/whoami", { Cookie = "user=" .. old }).body)
                assert.are.equal("nil", get("/strict", { Cookie = "user=" .. old }).body)
            end)
        end)
    end)
end)
