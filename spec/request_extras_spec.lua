-- Small things: req.scheme, req.id (X-Request-Id echoed when sane, else made; in the access and
-- error logs; sent back on every reply, the engine's own included, here where the server runs
-- with --request-id-header 2: the default's replies are in request_id_header_spec), the extended access log
-- (request time and id), k.app_dir(), a lone number returned as a status; over every protocol.
local server = require "helpers.server"
-- the User-Agent of the client making each protocol's requests (curl; kh-h3get for HTTP/3)
local AGENT = setmetatable({ h3 = "kh%-h3get" }, { __index = function() return "curl" end })

local APP = [[
local k = require "khamsin"
k.get("/scheme", function(req) return req.scheme end)
k.get("/id", function(req) return req.id end)
k.get("/boom", function(req) error("boom-" .. req.id) end)
k.get("/created", function() return 201 end)
k.get("/own-id", function(req, res) res.headers["X-Request-Id"] = "mine"; return req.id end)
k.get("/dir", function() return k.app_dir() end)
k.get("/file", function()
    local f = assert(io.open(k.app_dir() .. "/data.txt"))
    local s = f:read("*a")
    f:close()
    return s
end)
k.get("/slow", function() k.sleep(0.2); return "slow" end)
k.get("/log", function(req) k.log.warn("log-marker", req.path) ; return "logged" end)
k.timer(0, function() k.log.warn("timer-marker") end)
]]

describe("request extras", function()
    local srv, log_path
    setup(function()
        log_path = os.tmpname()
        os.remove(log_path)
        srv = server.start { app = APP, args = { "--access-log", log_path, "--access-log-format", "extended",
            "--request-id-header", "2" },
            expect_errors = { "handler error on GET /boom" } }
        server.write_file(srv.dir .. "/data.txt", "next to the app")
    end)
    teardown(function()
        if srv then srv:stop() end
        os.remove(log_path)
    end)

    local function access_line(pattern)
        return server.wait_until(5, function()
            for line in (server.read_file(log_path) or ""):gmatch("[^\n]+") do
                if line:find(pattern) then return line end
            end
        end)
    end

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function get(path, headers)
                return srv:request { proto = proto, path = path, headers = headers }
            end

            it("req.scheme says whether the connection is TLS", function()
                local want = (proto == "h1+tls" or proto == "h2" or proto == "h3") and "https" or "http"
                assert.are.equal(want, get("/scheme").body)
            end)

            it("req.id is made when the client sends none, and sent back", function()
                local a, b = get("/id"), get("/id")
                assert.truthy(a.body:find("^%x%x%x%x%x%x%x%x%-%d+%-%d+$"), a.body)
                assert.are.equal(a.body, a.headers["x-request-id"])
                assert.are.equal(b.body, b.headers["x-request-id"])
                assert.are_not.equal(a.body, b.body)
            end)

            it("echoes a sane X-Request-Id, replaces one that is not", function()
                local r = get("/id", { ["X-Request-Id"] = "abc-123_XYZ:9" })
                assert.are.equal("abc-123_XYZ:9", r.body)
                assert.are.equal("abc-123_XYZ:9", r.headers["x-request-id"])
                local long = string.rep("a", 128)
                assert.are.equal(long, get("/id", { ["X-Request-Id"] = long }).body)
                for _, bad in ipairs { string.rep("a", 129), "a b", "caf\195\169" } do
                    r = get("/id", { ["X-Request-Id"] = bad })
                    assert.truthy(r.body:find("^%x%x%x%x%x%x%x%x%-%d+%-%d+$"), r.body)
                    assert.are.equal(r.body, r.headers["x-request-id"])
                end
            end)

            it("keeps an X-Request-Id the handler sets; the engine's own replies carry one", function()
                local r = get("/own-id")
                local ids = {}
                for _, h in ipairs(r.header_list) do
                    if h[1] == "x-request-id" then ids[#ids + 1] = h[2] end
                end
                assert.are.same({ "mine" }, ids)
                r = get("/no-such-path")
                assert.are.equal(404, r.status)
                assert.truthy((r.headers["x-request-id"] or ""):find("^%x+%-%d+%-%d+$"), r.headers["x-request-id"])
            end)

            it("puts the id in the error log line of a handler error", function()
                local r = get("/boom")
                assert.are.equal(500, r.status)
                local id = r.headers["x-request-id"]
                assert.truthy(server.wait_until(5, function()
                    return srv:log():find("request " .. id .. ": handler error on GET /boom: ", 1, true)
                end), srv:log())
                -- once: the line is not prefixed twice
                assert.falsy(srv:log():find("request " .. id .. ": request ", 1, true), srv:log())
            end)

            it("starts a k.log line from a handler with the request id, not one from a timer", function()
                local r = get("/log")
                local id = r.headers["x-request-id"]
                assert.truthy(server.wait_until(5, function()
                    return srv:log():find("request " .. id .. ": log-marker /log", 1, true)
                end), srv:log())
                local line = srv:log():match("[^\n]*timer%-marker[^\n]*")
                assert.truthy(line and not line:find("request ", 1, true), line)
            end)

            it("writes the request time and id in the extended access log", function()
                local r = get("/slow", { ["X-Request-Id"] = "slow-" .. proto })
                assert.are.equal("slow", r.body)
                local line = access_line('"slow%-' .. proto:gsub("%p", "%%%0") .. '"$')
                assert.truthy(line, server.read_file(log_path))
                local t = line:match('"' .. AGENT[proto] .. '/[^"]*" (%d+%.%d%d%d) "')
                assert.truthy(t, line)
                assert.truthy(tonumber(t) >= 0.2 and tonumber(t) < 30, line)
                r = get("/no-such-path")
                local id = r.headers["x-request-id"]
                assert.truthy(access_line(' 404 %d+ "%-" "' .. AGENT[proto] .. '/[^"]*" %d+%.%d%d%d "' .. id:gsub("%p", "%%%0") .. '"$'),
                    server.read_file(log_path))
            end)

            it("k.app_dir() is the app's directory", function()
                local real = io.popen("cd " .. server.sh_quote(srv.dir) .. " && pwd -P"):read("*l")
                assert.are.equal(real, get("/dir").body)
                assert.are.equal("next to the app", get("/file").body)
            end)

            it("takes a lone number returned as the status", function()
                local r = get("/created")
                assert.are.equal(201, r.status)
                assert.are.equal("", r.body)
            end)
        end)
    end)
end)
