-- khamsin.test: start a khamsin app from a test (busted) and talk to it over HTTP/1.1 and HTTP/2.
-- Runs in the *test* process, never inside the server: plain Lua 5.1-5.4 or LuaJIT, no C module
-- needed (luasocket or luasystem, when present, give finer sleeps; curl makes the requests).
-- Not built into the khamsin binary (CMakeLists.txt leaves it out of the bytecode); installed
-- with the other modules (a LuaRocks tree: DIR/share/lua/5.1/khamsin/test.lua).
-- Owns:  one temporary directory per app (its script when given as source, the server's
--        stdout/stderr, pid and exit files), the server process it started, the curl runs.
-- In:    kt.start{...}; $KHAMSIN_BIN (else `khamsin` on PATH).
-- Out:   app objects: app:request / app:get / app:post (curl), app:log, app:errors, app:stop.
-- Never: guesses a port (it starts on port 0 and reads the "listening on HOST:PORT (tcp)" and
--        "(tls)" log lines), kills a process it did not start, or talks to anything but loopback.
-- The API (kt.start, the app's fields and methods, the response table) is documented in the
-- README ("Testing an app") and stays stable; anything not there is internal.
--
-- Lua has no fork: the server starts through a small sh wrapper in the background that records
-- its pid ($!) and, when it exits, its exit code.
local M = { _VERSION = "1" }

local unpack = unpack or table.unpack -- luacheck: ignore

local function sh_quote(s)
    return "'" .. (tostring(s):gsub("'", [['\'']])) .. "'"
end

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local data = f:read("*a")
    f:close()
    return data
end

local function write_file(path, data)
    local f = assert(io.open(path, "wb"))
    assert(f:write(data))
    f:close()
end

local function capture(cmd)
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    return out
end

-- os.execute: Lua 5.1 and LuaJIT (without 5.2 compat) return the wait status; 5.2+ return
-- ok, "exit" | "signal", code.
local function exec_status(cmd)
    local a, b, c = os.execute(cmd)
    if type(a) == "number" then
        if a >= 256 then return math.floor(a / 256) end
        return a
    end
    if b == "exit" then return c end
    return 128 + (c or 0)
end

-- clock and sleep: luasocket, else luasystem (a dependency of busted), else the sleep command
local now, sleep
do
    local ok, socket = pcall(require, "socket")
    if ok and type(socket) == "table" and socket.gettime and socket.sleep then
        now, sleep = socket.gettime, socket.sleep
    else
        local ok2, system = pcall(require, "system")
        if ok2 and type(system) == "table" and system.gettime and system.sleep then
            now, sleep = system.gettime, system.sleep
        else
            now = os.time
            sleep = function(s) os.execute("sleep " .. string.format("%.3f", s)) end
        end
    end
end

local function wait_until(timeout, fn, step)
    local deadline = now() + timeout
    while true do
        local v = fn()
        if v ~= nil and v ~= false then return v end
        if now() >= deadline then return nil end
        sleep(step or 0.02)
    end
end

local function trim(s)
    return (s:gsub("^[ \t]+", ""):gsub("[ \t]+$", ""))
end

local function abspath(p)
    if p:sub(1, 1) == "/" then return p end
    return (capture("pwd"):gsub("%s+$", "")) .. "/" .. p
end

local function shell_args(list)
    local out = {}
    for i, a in ipairs(list) do out[i] = sh_quote(a) end
    return table.concat(out, " ")
end

-- The binary: $KHAMSIN_BIN, else `khamsin` on PATH.
function M.bin()
    local bin = os.getenv("KHAMSIN_BIN")
    if bin and bin ~= "" then return bin end
    return "khamsin"
end

-- The HTTP/3 client (proto "h3"): $KHAMSIN_H3GET, else kh-h3get next to the binary (the build
-- directory), else `kh-h3get` on PATH. It is khamsin's own client (core/tools/kh_h3get.c):
-- Debian's curl has no HTTP/3.
function M.h3get(bin)
    local c = os.getenv("KHAMSIN_H3GET")
    if c and c ~= "" then return c end
    local dir = (bin or M.bin()):match("^(.*)/[^/]*$")
    if dir then
        local p = dir .. "/kh-h3get"
        local f = io.open(p)
        if f then f:close(); return p end
    end
    return "kh-h3get"
end

-- Parses the "listening on HOST:PORT (tcp|tls|quic)" lines of a log.
local function listening(log)
    local out = {}
    for host, port, kind in log:gmatch("listening on (%S+):(%d+) %((%a+)%)") do
        if kind == "tcp" or kind == "tls" or kind == "quic" then
            out[#out + 1] = { host = host, port = tonumber(port), tls = kind == "tls", quic = kind == "quic" }
        end
    end
    return out
end

local App = {}
App.__index = App

local running = {} -- apps not stopped yet: killed when busted exits, whatever the specs did

local function kill(pid, sig)
    if pid and tostring(pid):match("^%d+$") then
        os.execute("kill -" .. (sig or "TERM") .. " " .. pid .. " 2>/dev/null")
    end
end

do
    local ok, busted = pcall(require, "busted")
    if ok and type(busted) == "table" and busted.subscribe then
        busted.subscribe({ "exit" }, function()
            for app in pairs(running) do
                kill(app.pid, "KILL")
                running[app] = nil
            end
            return nil, true
        end)
    end
end

local function rmdir(dir)
    if dir and dir:match("^/tmp/khtest%.[%w]+$") and not os.getenv("KHAMSIN_TEST_KEEP") then
        os.execute("rm -rf " .. sh_quote(dir))
    end
end

-- kt.start{app = "path/app.lua" | source = "lua code", tls = false, http3 = false, workers = 1,
--          args = {}, env = {}, bin = M.bin(), timeout = 10, fail_on_errors = false}
-- Starts the app on 127.0.0.1, a free port (cleartext; with tls = true a TLS listener too, with
-- a self-signed certificate; with http3 = true also HTTP/3 on that port, which implies tls) and
-- returns once it is listening. Raises with the log when it does not start.
function M.start(opts)
    opts = opts or {}
    if type(opts) == "string" then opts = { app = opts } end
    assert(opts.app or opts.source, "khamsin.test.start: give app = path or source = code")
    local bin = opts.bin or M.bin()
    local dir = capture("mktemp -d /tmp/khtest.XXXXXX 2>/dev/null"):gsub("%s+$", "")
    assert(dir:match("^/tmp/khtest%."), "khamsin.test: mktemp -d failed")
    local self = setmetatable({
        dir = dir,
        log_path = dir .. "/stderr.log",
        out_path = dir .. "/stdout.log",
        pid_path = dir .. "/pid",
        exit_path = dir .. "/exit",
        opts = opts,
        nreq = 0,
    }, App)
    local script
    if opts.source then
        script = dir .. "/app.lua"
        write_file(script, opts.source)
    else
        script = abspath(opts.app)
    end
    self.script = script

    local args = { "--listen", "tcp://127.0.0.1:0" }
    if opts.http3 then
        opts.tls = true
        args[#args + 1] = "--http3"
    end
    if opts.tls then
        args[#args + 1] = "--listen"
        args[#args + 1] = "tls://127.0.0.1:0"
        args[#args + 1] = "--tls-self-signed"
    end
    args[#args + 1] = "--workers"
    args[#args + 1] = tostring(opts.workers or 1)
    for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
    args[#args + 1] = script

    local env = ""
    if opts.env and next(opts.env) then
        local parts = { "env" }
        for k, v in pairs(opts.env) do parts[#parts + 1] = sh_quote(k .. "=" .. v) end
        env = table.concat(parts, " ") .. " "
    end
    local wrapper = string.format("%s%s %s </dev/null >%s 2>%s & echo $! >%s; wait $!; echo $? >%s",
        env, sh_quote(bin), shell_args(args), sh_quote(self.out_path), sh_quote(self.log_path),
        sh_quote(self.pid_path), sh_quote(self.exit_path))
    os.execute("sh -c " .. sh_quote(wrapper) .. " </dev/null >/dev/null 2>&1 &")
    self.pid = wait_until(5, function()
        local p = read_file(self.pid_path)
        return p and p:match("^(%d+)")
    end)
    if not self.pid then
        rmdir(dir)
        error("khamsin.test: could not start " .. bin, 2)
    end
    running[self] = true

    local want = (opts.tls and 2 or 1) + (opts.http3 and 1 or 0)
    local found = wait_until(opts.timeout or 10, function()
        local l = listening(self:log())
        if #l >= want then return l end
        if self:exit_code() then return false end
    end)
    if not found then
        local code = self:exit_code()
        local log = self:log()
        kill(self.pid, "KILL")
        running[self] = nil
        rmdir(dir)
        error(string.format("khamsin.test: %s did not start (%s)\n--- log:\n%s", script,
            code and ("exited with code " .. code) or "no \"listening on\" line in time", log), 2)
    end
    for _, l in ipairs(found) do
        if l.quic then
            self.h3_url = "https://" .. l.host .. ":" .. l.port
        elseif l.tls then
            self.tls_port = l.port
            self.tls_url = "https://" .. l.host .. ":" .. l.port
        else
            self.host, self.port = l.host, l.port
            self.url = "http://" .. l.host .. ":" .. l.port
        end
    end
    return self
end

-- The server's error log (its stderr) so far.
function App:log()
    return read_file(self.log_path) or ""
end

-- The [error] lines of the log so far.
function App:errors()
    local out = {}
    for line in self:log():gmatch("[^\n]+") do
        if line:find("[error]", 1, true) then out[#out + 1] = line end
    end
    return out
end

function App:exit_code()
    local s = read_file(self.exit_path)
    return s and tonumber(s:match("^(%d+)"))
end

-- Stops the app (SIGTERM; SIGKILL after opts.timeout, 5 s) and returns its exit code and its
-- [error] lines. With fail_on_errors (here or in kt.start's options) it raises when the log has
-- [error] lines, the app had died on its own, or it did not exit with 0.
function App:stop(opts)
    opts = opts or {}
    if self.stopped then return self.code, self.error_lines end
    self.stopped = true
    local died = self:exit_code()
    if not died then
        kill(self.pid, "TERM")
        wait_until(opts.timeout or 5, function() return self:exit_code() end)
    end
    local code = self:exit_code()
    if not code then
        kill(self.pid, "KILL")
        wait_until(2, function() return self:exit_code() end)
    end
    running[self] = nil
    local errs = self:errors()
    self.code, self.error_lines = code, errs
    local strict = opts.fail_on_errors
    if strict == nil then strict = self.opts.fail_on_errors end
    local problems = {}
    if strict then
        if died then problems[#problems + 1] = "the app exited by itself with code " .. died end
        if not code then
            problems[#problems + 1] = "the app did not exit within " .. (opts.timeout or 5)
                .. " s of SIGTERM (killed)"
        elseif code ~= 0 and not died then
            problems[#problems + 1] = "the app exited with code " .. code .. " on SIGTERM"
        end
        if #errs > 0 then problems[#problems + 1] = "[error] lines in its log:\n  " .. table.concat(errs, "\n  ") end
    end
    if #problems > 0 then
        local log = self:log()
        rmdir(self.dir)
        error("khamsin.test: " .. table.concat(problems, "\n") .. "\n--- log tail:\n" .. log:sub(-3000), 2)
    end
    rmdir(self.dir)
    return code, errs
end

local CURL = {
    h1 = { "--http1.1" },
    h2c = { "--http2-prior-knowledge" },    -- HTTP/2 on cleartext, no Upgrade
    ["h1+tls"] = { "--http1.1", "-k" },     -- -k: the certificate is self-signed
    h2 = { "--http2", "-k" },               -- HTTP/2 over TLS (ALPN)
}
M.protocols = { "h1", "h2c", "h1+tls", "h2" } -- and "h3" with kt.start{http3 = true}

-- app:request{method = "GET", path = "/", headers = {name = value} or {{name, value}, ...},
--             body = nil, proto = "h1" | "h2c" | "h1+tls" | "h2" | "h3", timeout = 10}
-- Returns {status = 200, headers = {lower-case name = value (repeated joined by ", ")},
-- header_list = {{name, value}, ...}, body = "...", version = "1.1" | "2"}, or nil and curl's
-- message when no response came (refused, reset, timed out), or nil when the app is stopped.
function App:request(r)
    if type(r) == "string" then r = { path = r } end
    r = r or {}
    if self.stopped then return nil, "khamsin.test: the app is stopped" end
    local proto = r.proto or "h1"
    local pargs = CURL[proto]
    if proto == "h3" then
        if not self.h3_url then
            error("khamsin.test: proto h3 needs HTTP/3: kt.start{http3 = true, ...}", 2)
        end
        pargs = {}
    end
    if not pargs then error("khamsin.test: unknown proto '" .. tostring(proto) .. "' (h1, h2c, h1+tls, h2, h3)", 2) end
    local tls = proto == "h1+tls" or proto == "h2"
    if tls and not self.tls_port then
        error("khamsin.test: proto " .. proto .. " needs a TLS listener: kt.start{tls = true, ...}", 2)
    end
    local url = (proto == "h3" and self.h3_url or tls and self.tls_url or self.url) .. (r.path or "/")
    self.nreq = self.nreq + 1
    local base = string.format("%s/req%d", self.dir, self.nreq)
    local hdr, out, err, inp = base .. ".hdr", base .. ".body", base .. ".err", base .. ".in"
    local args
    if proto == "h3" then -- kh-h3get takes curl's -X -H -d -D -o (never verifies: like -k)
        args = { M.h3get(self.opts.bin), "--timeout", tostring(r.timeout or 10), "-D", hdr, "-o", out }
    else
        args = { "curl", "-s", "-S", "-g", "--path-as-is", "--noproxy", "*",
            "--max-time", tostring(r.timeout or 10), "-D", hdr, "-o", out }
    end
    for _, a in ipairs(pargs) do args[#args + 1] = a end
    local method = (r.method or "GET"):upper()
    if method == "HEAD" and proto ~= "h3" then
        args[#args + 1] = "-I"
    elseif method ~= "GET" or r.body then
        args[#args + 1] = "-X"
        args[#args + 1] = method
    end
    local list = {}
    if r.headers and r.headers[1] then
        list = r.headers
    else
        for name, value in pairs(r.headers or {}) do list[#list + 1] = { name, value } end
    end
    local expect = false
    for _, h in ipairs(list) do
        if h[1]:lower() == "expect" then expect = true end
        args[#args + 1] = "-H"
        args[#args + 1] = h[2] == "" and (h[1] .. ";") or (h[1] .. ": " .. h[2])
    end
    if not expect and proto ~= "h3" then
        args[#args + 1] = "-H"
        args[#args + 1] = "Expect:" -- no 100-continue round trip
    end
    if r.body then
        write_file(inp, r.body)
        args[#args + 1] = proto == "h3" and "-d" or "--data-binary"
        args[#args + 1] = "@" .. inp
    end
    args[#args + 1] = url
    local code = exec_status(shell_args(args) .. " 2>" .. sh_quote(err))
    local head = read_file(hdr) or ""
    local res = { headers = {}, header_list = {}, body = "" }
    -- the last header block (after any 1xx)
    local last
    for block in (head .. "\r\n\r\n"):gmatch("(HTTP/.-)\r\n\r\n") do last = block end
    if last then
        local status_line = last:match("^[^\r\n]*")
        res.version = status_line:match("^HTTP/(%S+)")
        res.status = tonumber(status_line:match("^HTTP/%S+ (%d%d%d)"))
        for line in last:sub(#status_line + 1):gmatch("[^\r\n]+") do
            local name, value = line:match("^([^:]+):(.*)$")
            if name then
                name, value = name:lower(), trim(value)
                res.header_list[#res.header_list + 1] = { name, value }
                res.headers[name] = res.headers[name] and (res.headers[name] .. ", " .. value) or value
            end
        end
    end
    if method ~= "HEAD" then res.body = read_file(out) or "" end
    local emsg = (read_file(err) or ""):gsub("%s+$", "")
    os.remove(hdr); os.remove(out); os.remove(err); os.remove(inp)
    if not res.status then
        return nil, args[1]:match("[^/]*$") .. " exited with " .. tostring(code) .. ": " .. emsg
    end
    return res
end

-- app:get(path, opts), app:post(path, body, opts): request with that method.
function App:get(path, opts)
    local r = {}
    for k, v in pairs(opts or {}) do r[k] = v end
    r.method, r.path = "GET", path
    return self:request(r)
end

function App:post(path, body, opts)
    local r = {}
    for k, v in pairs(opts or {}) do r[k] = v end
    r.method, r.path, r.body = "POST", path, body or ""
    return self:request(r)
end

M.sleep, M.now, M.wait_until = sleep, now, wait_until
return M
