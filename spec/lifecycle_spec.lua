-- Life cycle: scripts that fail to load, graceful stop (SIGTERM/SIGINT, --grace), the access
-- log, the error log's format and levels, --help and --version.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
k.get("/x", function() return "hello, world!" end)
k.post("/echo", function(req) return req:body() end)
k.get("/log-err", function(req)
    k.log.err("err-marker from a handler")
    return "logged"
end)
k.get("/log", function(req)
    k.log.warn("warn-marker from a handler")
    k.log.info("info-marker from a handler")
    k.log.debug("debug-marker from a handler")
    return "logged"
end)
]]

describe("a script that fails to load", function()
    it("with a syntax error at line 3: exits non-zero naming app.lua:3", function()
        local r = server.run {
            app = "local k = require \"khamsin\"\n\nlocal x = = 1\nk.get('/', function() return 'x' end)\n",
            args = { "--listen", "127.0.0.1:0", "--workers", "1" },
        }
        assert.are_not.equal(0, r.code)
        assert.are_not.equal(124, r.code, "khamsin kept running with a broken script")
        assert.truthy(r.stderr:find("app.lua:3", 1, true), "stderr does not name app.lua:3:\n" .. r.stderr)
        assert.truthy(r.stderr:find(r.app_path, 1, true) or r.stderr:find("app.lua", 1, true))
    end)

    it("with a runtime error while loading: exits non-zero naming app.lua:2 and the message", function()
        local r = server.run {
            app = "local k = require \"khamsin\"\nerror(\"load-time-boom\")\n",
            args = { "--listen", "127.0.0.1:0", "--workers", "2" },
        }
        assert.are_not.equal(0, r.code)
        assert.are_not.equal(124, r.code, "khamsin kept running with a broken script")
        assert.truthy(r.stderr:find("app.lua:2", 1, true), "stderr does not name app.lua:2:\n" .. r.stderr)
        assert.truthy(r.stderr:find("load-time-boom", 1, true), r.stderr)
    end)

    it("that does not exist: exits non-zero naming the file", function()
        local r = server.run { args = { "--listen", "127.0.0.1:0", "/tmp/kspec-no-such-app.lua" } }
        assert.are_not.equal(0, r.code)
        assert.are_not.equal(124, r.code)
        assert.truthy(r.stderr:find("kspec-no-such-app.lua", 1, true), r.stderr)
    end)

    it("with an unknown option: exits non-zero naming it", function()
        local r = server.run { app = APP, args = { "--no-such-option" } }
        assert.are_not.equal(0, r.code)
        assert.are_not.equal(124, r.code)
        assert.truthy(r.stderr:find("no-such-option", 1, true), r.stderr)
    end)
end)

describe("command line", function()
    it("--help prints the usage and exits 0", function()
        local r = server.run { args = { "--help" } }
        assert.are.equal(0, r.code)
        local out = r.stdout .. r.stderr
        for _, opt in ipairs { "--listen", "--workers", "--dev", "--grace", "--access-log", "--log-level",
            "--limit", "--print-limits" } do
            assert.truthy(out:find(opt, 1, true), opt .. " missing from --help:\n" .. out)
        end
    end)

    it("--version prints a version and exits 0", function()
        local r = server.run { args = { "--version" } }
        assert.are.equal(0, r.code)
        assert.truthy((r.stdout .. r.stderr):find("%d+%.%d+%.%d+"), r.stdout .. r.stderr)
    end)
end)

describe("graceful stop", function()
    it("finishes a request that is mid-body at SIGTERM, refuses new connections, exits 0", function()
        local srv = server.start { app = APP }
        local ok, err = pcall(function()
            local c = srv:raw_conn()
            c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
            server.sleep(0.2)
            srv:signal("TERM")
            server.sleep(0.3)
            assert.is_nil(srv:exit_code(), "exited with a request in flight")

            -- no new connection is served any more
            local c2 = server.connect("127.0.0.1", srv.port, { connect_timeout = 1 })
            if c2 then
                c2:send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                local r2 = c2:read_response { timeout = 0.5 }
                c2:close()
                assert.falsy(r2 and r2.status == 200, "a new connection was served after SIGTERM")
            end

            c:send("56789")
            local r = assert(c:read_response { timeout = 3 })
            assert.are.equal(200, r.status)
            assert.are.equal("0123456789", r.body)
            assert.are.equal("close", (r.headers.connection or ""):lower(), "no Connection: close while stopping")
            assert.is_true((c:wait_closed(2)))
            c:close()
            assert.are.equal(0, srv:wait_exit(3))
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("closes idle keep-alive connections and exits at once", function()
        local srv = server.start { app = APP }
        local ok, err = pcall(function()
            local c = srv:raw_conn()
            c:send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert.are.equal(200, assert(c:read_response()).status)
            srv:signal("TERM")
            assert.are.equal(0, srv:wait_exit(5))
            -- at once: far from the default grace (5 s), and no connection left to close at its end
            local took = srv:stop_seconds() -- by the server's clock, without the exit's leak check
            assert.truthy(took < 2.5, "the stop took " .. took .. " s with an idle connection")
            assert.falsy(srv:log():find("grace period over", 1, true), srv:log())
            assert.is_true((c:wait_closed(1)))
            c:close()
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("stops on SIGINT too, with exit code 0", function()
        local srv = server.start { app = APP }
        local ok, err = pcall(function()
            assert.are.equal(200, srv:request { path = "/x" }.status)
            srv:signal("INT")
            assert.are.equal(0, srv:wait_exit(3))
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("hears SIGTERM from its first 'listening' line on (a stop at once is graceful, exit 0)", function()
        -- The handlers used to be installed by the supervisor thread after the go, so a stop sent
        -- as soon as the line was read could meet the default action (exit 143) on a busy box.
        for _ = 1, 5 do
            local srv = server.start { app = APP, args = { "--workers", "2" } }
            local ok, err = pcall(function()
                srv:signal("TERM")
                assert.are.equal(0, srv:wait_exit(5))
                assert.truthy(srv:log():find("SIGTERM: stopping", 1, true))
            end)
            srv:stop()
            assert(ok, err)
        end
    end)

    it("gives up on a stuck request after --grace and still exits", function()
        local srv = server.start { app = APP, args = { "--grace", "1" } }
        local ok, err = pcall(function()
            local c = srv:raw_conn()
            c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
            server.sleep(0.2)
            srv:signal("TERM")
            local code = srv:wait_exit(10)
            assert.truthy(code, "still running 10 s after SIGTERM with --grace 1")
            assert.are.equal(0, code)
            -- by the server's clock: it waited for the grace, then closed the stuck connection
            local took, t0 = srv:stop_seconds()
            local tg = srv:log_time("grace period over: closing 1 connections")
            assert.truthy(tg, "no 'grace period over' line:\n" .. srv:log())
            assert.truthy(tg - t0 >= 0.95, "did not wait for the grace period: " .. (tg - t0))
            assert.truthy(took < 2.5, "exceeded the grace period: " .. took)
            c:close()
        end)
        srv:stop()
        assert(ok, err)
    end)
end)

describe("access log", function()
    local LINE = '^127%.0%.0%.1 %- %- %[(%d%d/%a%a%a/%d%d%d%d:%d%d:%d%d:%d%d [+-]%d%d%d%d)%] '
        .. '"GET /x HTTP/1%.1" 200 13 "%-" "curl/[^"]+"$'

    it("writes a combined-format line to --access-log FILE", function()
        local path = os.tmpname()
        os.remove(path)
        local srv = server.start { app = APP, args = { "--access-log", path } }
        local ok, err = pcall(function()
            local r = srv:request { path = "/x" }
            assert.are.equal(200, r.status)
            assert.are.equal("hello, world!", r.body)
            local function find_line()
                local text = server.read_file(path) or ""
                for line in text:gmatch("[^\n]+") do
                    if line:match(LINE) then return line end
                end
            end
            local line = server.wait_until(2, find_line)
            if not line then -- the log may be buffered until exit
                srv:signal("TERM")
                srv:wait_exit(3)
                line = find_line()
            end
            assert.truthy(line, "no combined-format line in the access log:\n" .. tostring(server.read_file(path)))
        end)
        srv:stop()
        os.remove(path)
        assert(ok, err)
    end)

    it("logs the referer and a POST's status", function()
        local path = os.tmpname()
        os.remove(path)
        local srv = server.start { app = APP, args = { "--access-log", path } }
        local ok, err = pcall(function()
            srv:request { method = "POST", path = "/echo", body = "abc", headers = { Referer = "http://r/" } }
            srv:request { path = "/missing" }
            local text = server.wait_until(2, function()
                local t = server.read_file(path) or ""
                return t:find('"GET /missing', 1, true) and t
            end)
            if not text then
                srv:signal("TERM")
                srv:wait_exit(3)
                text = server.read_file(path) or ""
            end
            assert.truthy(text:find('"POST /echo HTTP/1.1" 200 3 "http://r/" "curl/', 1, true), text)
            assert.truthy(text:find('"GET /missing HTTP/1.1" 404 %d+ "%-" "curl/'), text)
        end)
        srv:stop()
        os.remove(path)
        assert(ok, err)
    end)
end)

describe("error log", function()
    it("has the timestamped format and one listening line", function()
        local srv = server.start { app = APP }
        local ok, err = pcall(function()
            local line = srv:log():match("[^\n]*listening on 127%.0%.0%.1:%d+ %(tcp%)[^\n]*")
            assert.truthy(line:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ %[info%] "), line)
            assert.truthy(line:match("listening on 127%.0%.0%.1:" .. srv.port .. " %(tcp%)$"), line)
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("carries k.log lines at their level, and hides debug at the default level", function()
        local srv = server.start { app = APP }
        local ok, err = pcall(function()
            assert.are.equal("logged", srv:request { path = "/log" }.body)
            assert.truthy(srv:wait_log("%[warn%][^\n]*warn%-marker from a handler", 2), srv:log())
            assert.truthy(srv:wait_log("%[info%][^\n]*info%-marker from a handler", 2), srv:log())
            server.sleep(0.1)
            assert.falsy(srv:log():find("debug-marker", 1, true), srv:log())
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("writes k.log.err as an [error] line", function()
        local srv = server.start { app = APP, expect_errors = { "err%-marker from a handler" } }
        local ok, err = pcall(function()
            assert.are.equal("logged", srv:request { path = "/log-err" }.body)
            assert.truthy(srv:wait_log("%[error%][^\n]*err%-marker from a handler", 2), srv:log())
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("shows debug lines with --log-level debug", function()
        local srv = server.start { app = APP, args = { "--log-level", "debug" } }
        local ok, err = pcall(function()
            assert.are.equal("logged", srv:request { path = "/log" }.body)
            assert.truthy(srv:wait_log("%[debug%][^\n]*debug%-marker from a handler", 2), srv:log())
        end)
        srv:stop()
        assert(ok, err)
    end)
end)
