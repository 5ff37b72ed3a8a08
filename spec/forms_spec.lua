-- req:form(): application/x-www-form-urlencoded bodies over h1, h1+tls, h2c and h2: "+" as a
-- space, percent-decoding, repeated names as arrays, a pair without "=" as "", the form_fields
-- limit (flag and opts.max_fields), 400 for a malformed escape, 415 for another Content-Type,
-- and misuse of the API raised at the app's line.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.post("/form", function(req)
    local f = req:form()
    assert(req:form() == f) -- cached
    return f
end)
k.post("/max", function(req) return req:form { max_fields = 2 } end)
k.post("/misuse", function(req)
    local ok, e = pcall(req.form, req, { max_fields = 0 })
    return tostring(ok) .. " " .. tostring(e)
end)
]]

local FORM = { ["Content-Type"] = "application/x-www-form-urlencoded" }

describe("req:form()", function()
    local srv
    setup(function() srv = server.start { app = APP, args = { "--form-fields", "6" } } end)
    teardown(function() if srv then srv:stop() end end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function post(path, body, headers)
                return srv:request { proto = proto, method = "POST", path = path, body = body,
                    headers = headers or FORM }
            end
            local json = require "cjson"

            it("decodes + and %XX, keeps repeated names in order, '' for a bare name", function()
                local r = post("/form", "a=1&b=x+y%20z&b=2&&c&%C3%A9t%C3%A9=%26%3D%2B&b=3")
                assert.are.equal(200, r.status, r.body)
                assert.are.same({ a = "1", b = { "x y z", "2", "3" }, c = "", ["été"] = "&=+" },
                    json.decode(r.body))
            end)

            it("takes an empty body as an empty form", function()
                local r = post("/form", "")
                assert.are.equal(200, r.status, r.body)
                assert.are.equal("{}", r.body)
            end)

            it("accepts a charset parameter on the Content-Type", function()
                local r = post("/form", "a=1", { ["Content-Type"] = "Application/X-WWW-Form-Urlencoded; charset=UTF-8" })
                assert.are.equal(200, r.status, r.body)
                assert.are.same({ a = "1" }, json.decode(r.body))
            end)

            it("refuses a '%' without two hex digits with 400 and the reason", function()
                for _, body in ipairs { "a=%", "a=%4", "a=%zz", "%G1=1", "a=1%" } do
                    local r = post("/form", body)
                    assert.are.equal(400, r.status, body)
                    assert.truthy(r.body:find("not followed by two hex digits", 1, true), r.body)
                end
            end)

            it("refuses more fields than form_fields (--form-fields 6) or opts.max_fields", function()
                assert.are.equal(200, post("/form", "a=1&b=2&c=3&d=4&e=5&f=6").status)
                local r = post("/form", "a=1&b=2&c=3&d=4&e=5&f=6&g=7")
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("more than 6 fields", 1, true), r.body)
                assert.are.equal(200, post("/max", "a=1&b=2").status)
                r = post("/max", "a=1&b=2&c=3")
                assert.are.equal(400, r.status)
                assert.truthy(r.body:find("more than 2 fields", 1, true), r.body)
            end)

            it("answers 415 for another Content-Type or none", function()
                local r = post("/form", "a=1", { ["Content-Type"] = "text/plain" })
                assert.are.equal(415, r.status)
                assert.truthy(r.body:find("Content-Type text/plain", 1, true), r.body)
                r = post("/form", "a=1", { ["Content-Type"] = false })
                assert.are.equal(415, r.status)
            end)

            it("raises a misuse at the app's line", function()
                local r = post("/misuse", "")
                assert.truthy(r.body:find("^false [^ ]*app%.lua:%d+: req:form%(opts%)"), r.body)
            end)
        end)
    end)
end)
