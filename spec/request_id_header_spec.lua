-- Limit request_id_header (core/kh_limits.h, kh_stream.c send_head_extra): 1 by default, every
-- reply carries the request id back as X-Request-Id (a handler's reply and the engine's own 404
-- and 500); 0 sends none, and everything else about request ids stays: req.id, a client's sane
-- X-Request-Id taken as req.id, the id in a handler error's log line and in the extended access
-- log, and an X-Request-Id the handler sets itself. Over every protocol (curl; kh-h3get for h3).
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/id", function(req) return req.id end)
k.get("/boom", function(req) error("boom") end)
k.get("/own-id", function(req, res) res.headers["X-Request-Id"] = "mine"; return req.id end)
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
        setup(function() srv = server.start { app = APP } end)
        teardown(function() if srv then srv:stop() end end)

        server.each_protocol(function(proto)
            it("echoes the id on a handler's reply and on the engine's 404 over " .. proto, function()
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
            assert.truthy(r.stdout:find("\nrequest_id_header +0 +0 +1 "), r.stdout)
        end)

        server.each_protocol(function(proto)
            describe("over " .. proto, function()
                local function get(path, headers)
                    return srv:request { proto = proto, path = path, headers = headers }
                end

                it("sends no X-Request-Id, on a handler's reply or the engine's 404 and 500", function()
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
