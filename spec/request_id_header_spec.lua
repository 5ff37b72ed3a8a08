-- Limit request_id_header (core/kh_limits.h, kh_stream.c send_head_extra). By default (1) a
-- reply carries X-Request-Id back when the client sent a sane one of its own, and every 5xx
-- carries the request's id (the one its log line names), on a handler's reply and on the engine's
-- own 404 and 500 alike; 2 sends it on every reply (an id made here when the client sent none); 0
-- sends none. Everything else about request ids stays in each mode: req.id, a client's sane
-- X-Request-Id taken as req.id, the id in a handler error's log line and in the extended access
-- log, and an X-Request-Id the handler sets itself. Over every protocol (curl; kh-h3get for h3).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/id", function(req) return req.id end)
k.get("/boom", function(req) error("boom") end)
k.get("/own-id", function(req, res) res.headers["X-Request-Id"] = "mine"; return req.id end)
k.get("/status/503", function(req) return 503, "busy" end)
]]
local MADE = "^%x%x%x%x%x%x%x%x%-%d+%-%d+$" -- an id the engine makes (kh_reqid.h)

-- Every value of a field (lower-case name) in a response, in order.
local function values(r, name)
    local out = {}
    for _, h in ipairs(r.header_list) do
        if h[1] == name then out[#out + 1] = h[2] end
    end
    return out
end

local function esc(s) return (s:gsub("%p", "%%%0")) end

describe("request_id_header", function()
    describe("by default (1)", function()
        local srv
        setup(function()
            srv = server.start { app = APP, expect_errors = { "handler error on GET /boom" } }
        end)
        teardown(function() if srv then srv:stop() end end)

        it("is in --print-limits as 1, 0 to 2", function()
            local r = server.run { args = { "--print-limits" } }
            assert.are.equal(0, r.code)
            assert.truthy(r.stdout:find("\nrequest_id_header +1 +0 +2 "), r.stdout)
        end)

        server.each_protocol(function(proto)
            it("echoes a client's id, adds none of its own but on a 5xx, over " .. proto, function()
                local r = srv:request { proto = proto, path = "/id" }
                assert.are.equal(200, r.status)
                assert.truthy(r.body:find(MADE), r.body) -- req.id is made all the same
                assert.are.same({}, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/id", headers = { ["X-Request-Id"] = "cli-" .. proto } }
                assert.are.equal("cli-" .. proto, r.body)
                assert.are.same({ "cli-" .. proto }, values(r, "x-request-id"), proto)
                -- a value that is not sane is neither taken nor echoed
                r = srv:request { proto = proto, path = "/id", headers = { ["X-Request-Id"] = "bad id" } }
                assert.truthy(r.body:find(MADE), r.body)
                assert.are.same({}, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/no-such-route" }
                assert.are.equal(404, r.status)
                assert.are.same({}, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/no-such-route", headers = { ["X-Request-Id"] = "nf-" .. proto } }
                assert.are.equal(404, r.status)
                assert.are.same({ "nf-" .. proto }, values(r, "x-request-id"), proto)
            end)

            it("sends the id its log line names on the engine's 500 over " .. proto, function()
                local r = srv:request { proto = proto, path = "/boom" }
                assert.are.equal(500, r.status)
                local ids = values(r, "x-request-id")
                assert.are.equal(1, #ids, proto)
                assert.truthy(ids[1]:find(MADE), ids[1])
                assert.truthy(server.wait_until(5, function()
                    return srv:log():find("request " .. ids[1] .. ": handler error on GET /boom: ", 1, true)
                end), srv:log())
                r = srv:request { proto = proto, path = "/status/503" }
                assert.are.equal(503, r.status)
                ids = values(r, "x-request-id")
                assert.are.equal(1, #ids, proto)
                assert.truthy(ids[1]:find(MADE), ids[1])
            end)

            it("sends the handler's own X-Request-Id as it is over " .. proto, function()
                local r = srv:request { proto = proto, path = "/own-id" }
                assert.are.same({ "mine" }, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/own-id", headers = { ["X-Request-Id"] = "own-" .. proto } }
                assert.are.equal("own-" .. proto, r.body)
                assert.are.same({ "mine" }, values(r, "x-request-id"), proto)
            end)
        end)
    end)

    describe("with --request-id-header 2", function()
        local srv
        setup(function() srv = server.start { app = APP, args = { "--request-id-header", "2" } } end)
        teardown(function() if srv then srv:stop() end end)

        server.each_protocol(function(proto)
            it("echoes the id on every reply, a handler's and the engine's 404, over " .. proto, function()
                local r = srv:request { proto = proto, path = "/id" }
                assert.are.equal(200, r.status)
                assert.truthy(r.body:find(MADE), r.body)
                assert.are.same({ r.body }, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/id", headers = { ["X-Request-Id"] = "cli-" .. proto } }
                assert.are.same({ "cli-" .. proto }, values(r, "x-request-id"), proto)
                r = srv:request { proto = proto, path = "/no-such-route" }
                assert.are.equal(404, r.status)
                local ids = values(r, "x-request-id")
                assert.are.equal(1, #ids, proto)
                assert.truthy(ids[1]:find(MADE), ids[1])
                r = srv:request { proto = proto, path = "/own-id" }
                assert.are.same({ "mine" }, values(r, "x-request-id"), proto)
            end)
        end)
    end)

    describe("with --request-id-header 0", function()
        local srv, log_path
        setup(function()
            log_path = os.tmpname()
            os.remove(log_path)
            srv = server.start { app = APP, args = { "--request-id-header", "0", "--access-log", log_path,
                "--access-log-format", "extended" }, expect_errors = { "handler error on GET /boom" } }
        end)
        teardown(function()
            if srv then srv:stop() end
            os.remove(log_path)
        end)

        it("is in --print-limits as 0", function()
            local r = server.run { args = { "--request-id-header", "0", "--print-limits" } }
            assert.are.equal(0, r.code)
            assert.truthy(r.stdout:find("\nrequest_id_header +0 +0 +2 "), r.stdout)
        end)

        server.each_protocol(function(proto)
            describe("over " .. proto, function()
                local function get(path, headers)
                    return srv:request { proto = proto, path = path, headers = headers }
                end

                it("sends no X-Request-Id, on a handler's reply or the engine's 404", function()
                    local r = get("/id")
                    assert.are.equal(200, r.status)
                    assert.truthy(r.body:find(MADE), r.body) -- req.id is still made
                    assert.are.same({}, values(r, "x-request-id"), proto)
                    r = get("/id", { ["X-Request-Id"] = "quiet-" .. proto })
                    assert.are.equal("quiet-" .. proto, r.body) -- the client's still becomes req.id
                    assert.are.same({}, values(r, "x-request-id"), proto)
                    r = get("/no-such-route")
                    assert.are.equal(404, r.status)
                    assert.are.same({}, values(r, "x-request-id"), proto)
                end)

                it("still sends an X-Request-Id the handler sets", function()
                    local r = get("/own-id", { ["X-Request-Id"] = "own-" .. proto })
                    assert.are.equal("own-" .. proto, r.body)
                    assert.are.same({ "mine" }, values(r, "x-request-id"), proto)
                end)

                it("keeps the client's id in the error log line and the access log", function()
                    local id = "err-" .. proto
                    local r = get("/boom", { ["X-Request-Id"] = id })
                    assert.are.equal(500, r.status)
                    assert.are.same({}, values(r, "x-request-id"), proto)
                    assert.truthy(server.wait_until(5, function()
                        return srv:log():find("request " .. id .. ": handler error on GET /boom: ", 1, true)
                    end), srv:log())
                    assert.truthy(server.wait_until(5, function()
                        return (server.read_file(log_path) or ""):find(' 500 %d+ "%-" "[^"]*" %d+%.%d%d%d "' .. esc(id) .. '"\n')
                    end), server.read_file(log_path))
                end)
            end)
        end)
    end)
end)
