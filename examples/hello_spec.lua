-- examples/hello_spec.lua: testing an app with khamsin.test (README, "Testing an app").
-- Run from the repository root: `busted examples/hello_spec.lua` (make test runs it, with
-- KHAMSIN_BIN set to the build's binary; otherwise `khamsin` on PATH).
local kt = require "khamsin.test"

describe("examples/hello.lua", function()
    local app

    setup(function()
        -- a subprocess on a free port of 127.0.0.1; tls = true adds a TLS listener (self-signed)
        app = kt.start { app = "examples/hello.lua", tls = true, fail_on_errors = true }
    end)

    teardown(function()
        app:stop() -- raises here if the log has [error] lines (fail_on_errors)
    end)

    for _, proto in ipairs { "h1", "h2c", "h1+tls", "h2" } do
        it("says hello over " .. proto, function()
            local res = assert(app:get("/", { proto = proto }))
            assert.are.equal(200, res.status)
            assert.are.equal("text/plain; charset=utf-8", res.headers["content-type"])
            assert.are.equal("Hello, World!", res.body)
            assert.are.equal(proto:match("^h2") and "2" or "1.1", res.version)
        end)
    end

    it("answers JSON with the route's params", function()
        local res = assert(app:get("/users/42", { headers = { ["User-Agent"] = "spec" } }))
        assert.are.equal(200, res.status)
        assert.are.equal("application/json", res.headers["content-type"])
        assert.truthy(res.body:find('"id":"42"', 1, true))
        assert.truthy(res.body:find('"agent":"spec"', 1, true))
    end)

    it("echoes a body with 201", function()
        local res = assert(app:post("/echo", "ping", { proto = "h2",
            headers = { ["Content-Type"] = "text/x-ping" } }))
        assert.are.equal(201, res.status)
        assert.are.equal("text/x-ping", res.headers["content-type"])
        assert.are.equal("ping", res.body)
    end)

    it("has no route for an unknown path", function()
        assert.are.equal(404, assert(app:get("/nope")).status)
    end)
end)
