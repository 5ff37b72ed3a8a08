-- spec/startup_workers_spec.lua: start-up with several workers (issue 15 item 5). Each worker
-- serves as soon as it has loaded the app, worker 0 (main's thread) too: it no longer waits for
-- the others. The rule stays that a worker failing to load ends the server with exit code 1 and
-- its error; what worker 0 answered before stays answered, its idle connections are closed,
-- and new connections are refused. The 'listening on' lines still mean every worker has
-- loaded, and a worker that is still loading is not taken for a stalled one by the watchdog.
-- The app holds worker 1's load until the spec creates a flag file (and fails it when a second
-- flag says so); the port is fixed (server.free_port), since no 'listening' line comes first.
local server = require "helpers.server"
local socket = require "socket"

local function app(flag)
    return [[
local k = require "khamsin"
local ffi = require "ffi"
ffi.cdef "int usleep(unsigned int usec);"
local FLAG = "]] .. flag .. [["
if k.worker_id() == 1 then
    for _ = 1, 3000 do -- up to 30 s
        local f = io.open(FLAG)
        if f then f:close() break end
        ffi.C.usleep(10000)
    end
    local f = io.open(FLAG .. ".fail")
    if f then f:close() error("w1-load-boom") end
end
k.get("/", function() return "w" .. k.worker_id() end)
]]
end

local function touch(path)
    local f = assert(io.open(path, "w"))
    f:close()
end

-- One request on a new connection; the body, or nil when nothing complete came within timeout
-- (a connection the kernel queued on the socket of a worker still loading waits there).
-- keep: the connection stays open (returned second).
local function get(port, timeout, keep)
    local c = socket.tcp()
    c:settimeout(timeout)
    if not c:connect("127.0.0.1", port) then
        c:close()
        return nil
    end
    c:send("GET / HTTP/1.1\r\nHost: x\r\n" .. (keep and "" or "Connection: close\r\n") .. "\r\n")
    local buf = ""
    local deadline = socket.gettime() + timeout
    while socket.gettime() < deadline do
        local data, err, partial = c:receive(1)
        buf = buf .. (data or partial or "")
        local head_end = buf:find("\r\n\r\n", 1, true)
        if head_end then
            local len = tonumber(buf:match("[Cc]ontent%-[Ll]ength: *(%d+)"))
            if len and #buf >= head_end + 3 + len then
                local status = tonumber(buf:match("^HTTP/1%.1 (%d+)"))
                local body = buf:sub(head_end + 4, head_end + 3 + len)
                if keep then return status == 200 and body or nil, c end
                c:close()
                return status == 200 and body or nil
            end
        end
        if err and err ~= "timeout" then break end
    end
    c:close()
    return nil
end

-- Polls until worker 0 answers (a connection on worker 1's socket times out: another is made).
local function answer_from_w0(port, keep)
    local deadline = socket.gettime() + 30
    while socket.gettime() < deadline do
        local body, conn = get(port, 0.3, keep)
        if body == "w0" then return body, conn end
        if conn then conn:close() end
    end
end

local function wait_for(timeout, fn)
    local deadline = socket.gettime() + timeout
    while socket.gettime() < deadline do
        local v = fn()
        if v then return v end
        socket.sleep(0.02)
    end
end

describe("start-up with two workers, worker 1 slow to load", function()
    local flag
    before_each(function()
        flag = os.tmpname()
        os.remove(flag)
    end)
    after_each(function()
        os.remove(flag)
        os.remove(flag .. ".fail")
    end)

    it("worker 0 answers while worker 1 loads; 'listening' once both have; no stall reported", function()
        local port = server.free_port()
        local srv = server.start {
            app = app(flag), workers = 2, no_wait = true, listen = { "127.0.0.1:" .. port },
            -- the watchdog's shortest limits: a loading worker must not count as stalled
            args = { "--stall-report-ms", "100", "--stall-shed-ms", "100" },
        }
        local ok, err = pcall(function()
            assert.are.equal("w0", answer_from_w0(port), "worker 0 did not answer while worker 1 loaded")
            socket.sleep(0.3) -- three of the watchdog's report periods, worker 1 still loading
            local log = srv:log()
            assert.falsy(log:find("listening on", 1, true), "a 'listening' line before worker 1 loaded:\n" .. log)
            assert.falsy(log:find("stall", 1, true), "a loading worker reported as stalled:\n" .. log)
            touch(flag)
            assert.truthy(wait_for(30, function() return srv:log():find("listening on 127.0.0.1:" .. port, 1, true) end),
                "no 'listening' line once worker 1 loaded:\n" .. srv:log())
            assert.truthy(srv:log():find("2 workers serving", 1, true), srv:log())
            -- both serve now: connections land on either socket
            local seen = {}
            wait_for(30, function()
                local b = get(port, 2)
                if b then seen[b] = true end
                return seen.w0 and seen.w1
            end)
            assert.is_true(seen.w0 and seen.w1, "not both workers answered")
            assert.falsy(srv:log():find("stall", 1, true), srv:log())
        end)
        srv:stop()
        assert(ok, err)
    end)

    it("worker 1 fails after worker 0 answered: that answer stands, exit 1 with the error, idle connections closed, new ones refused", function()
        local port = server.free_port()
        local srv = server.start {
            app = app(flag), workers = 2, no_wait = true, listen = { "127.0.0.1:" .. port },
            expect_errors = { "worker 1 failed to load the app" },
        }
        local ok, err = pcall(function()
            local body, conn = answer_from_w0(port, true)
            assert.are.equal("w0", body, "worker 0 did not answer while worker 1 loaded")
            touch(flag .. ".fail")
            touch(flag)
            local code = srv:wait_exit(30)
            assert.are.equal(1, code, "exit code after worker 1 failed to load:\n" .. srv:log())
            local log = srv:log()
            assert.truthy(log:find("khamsin: [^\n]*app%.lua:%d+: w1%-load%-boom"), "no load error in:\n" .. log)
            assert.falsy(log:find("listening on", 1, true), log)
            -- the keep-alive connection worker 0 answered on was closed by the stop
            conn:settimeout(5)
            local data, rerr = conn:receive(1)
            conn:close()
            assert.is_nil(data)
            assert.are.equal("closed", rerr)
            local c = socket.tcp()
            c:settimeout(1)
            local connected = c:connect("127.0.0.1", port)
            c:close()
            assert.falsy(connected, "the port still takes connections after the exit")
        end)
        srv:stop()
        assert(ok, err)
    end)
end)
