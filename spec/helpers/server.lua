-- spec/helpers/server.lua: start the real khamsin binary for a spec and talk to it.
-- Owns:  one temporary directory per server (app.lua, the log, pid and exit files), the
--        server process it started, and every client socket/curl run it makes.
-- In:    $KHAMSIN_BIN (default <repo>/build/khamsin); spec options ({app, args, workers, ...}).
-- Out:   srv objects: srv:request (curl; kh-h3get for "h3"), srv:raw / srv:raw_conn (luasocket), srv:log,
--        srv:signal, srv:wait_exit, srv:stop (fails the spec on unexpected [error] lines).
-- Never: guesses a port (it reads the "listening on HOST:PORT (tcp)" log lines), kills any
--        process it did not start, or talks to anything but loopback.
--
-- LuaJIT has no fork, so a server is started through a small sh wrapper run in the
-- background: it records the server's pid ($!) and, when the server exits, its exit code.
local socket = require "socket"

local M = {}

local unpack = unpack or table.unpack

---------------------------------------------------------------------------------------------
-- small utilities

local function sh_quote(s)
    return "'" .. (tostring(s):gsub("'", [['\'']])) .. "'"
end
M.sh_quote = sh_quote

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local data = f:read("*a")
    f:close()
    return data
end
M.read_file = read_file

local function write_file(path, data)
    local f = assert(io.open(path, "wb"))
    assert(f:write(data))
    f:close()
end
M.write_file = write_file

local function capture(cmd)
    local p = assert(io.popen(cmd, "r"))
    local out = p:read("*a")
    p:close()
    return out
end

-- os.execute in LuaJIT (5.1 mode) returns the raw wait status; 5.2+ returns ok, how, code.
local function exec_status(cmd)
    local a, b, c = os.execute(cmd)
    if type(a) == "number" then
        if a >= 256 then return math.floor(a / 256) end
        return a
    end
    if b == "exit" then return c end
    return 128 + (c or 0)
end

local now, sleep = socket.gettime, socket.sleep
M.now, M.sleep = now, sleep

local function trim(s)
    return (s:gsub("^[ \t]+", ""):gsub("[ \t]+$", ""))
end

local function cwd()
    return (capture("pwd"):gsub("%s+$", ""))
end

-- <repo>: two levels above this file.
local function repo_root()
    local src = debug.getinfo(1, "S").source
    src = src:sub(1, 1) == "@" and src:sub(2) or src
    local dir = src:match("^(.*)/[^/]*$") or "."
    if dir:sub(1, 1) ~= "/" then dir = cwd() .. "/" .. dir end
    dir = dir .. "/../.."
    -- normalise "a/b/../.." without touching the file system
    local parts = {}
    for part in dir:gmatch("[^/]+") do
        if part == ".." then
            parts[#parts] = nil
        elseif part ~= "." then
            parts[#parts + 1] = part
        end
    end
    return "/" .. table.concat(parts, "/")
end
M.root = repo_root()

function M.bin()
    local bin = os.getenv("KHAMSIN_BIN")
    if not bin or bin == "" then bin = M.root .. "/build/khamsin" end
    return bin
end

-- Temporary directories are /tmp/kspec.XXXXXX: no "khamsin" in their names, see alias_bin.
local function mktempdir()
    local dir = capture("mktemp -d /tmp/kspec.XXXXXX 2>/dev/null"):gsub("%s+$", "")
    assert(dir ~= "" and dir:match("^/tmp/kspec%."), "mktemp -d failed")
    return dir
end

local function rmtempdir(dir)
    if dir and dir:match("^/tmp/kspec%.[%w]+$") and not os.getenv("KHAMSIN_SPEC_KEEP") then
        os.execute("rm -rf " .. sh_quote(dir))
    end
end

local function wait_until(timeout, fn, step)
    local deadline = now() + timeout
    while true do
        local v = fn()
        if v ~= nil and v ~= false then return v end
        if now() >= deadline then return nil end
        sleep(step or 0.01)
    end
end
M.wait_until = wait_until

---------------------------------------------------------------------------------------------
-- HTTP/1.x response parsing (for raw sockets)

-- Parses one response at the start of buf.
-- Returns resp, rest on success; nil when more bytes are needed (needs_close = true when the
-- body is delimited by the close of the connection); false, err when the bytes are not HTTP.
-- opts.head: the response answers a HEAD request (no body whatever the headers say).
-- opts.closed: the connection is closed, so a close-delimited body is complete.
local function parse_response(buf, opts)
    opts = opts or {}
    local e = buf:find("\r\n\r\n", 1, true)
    if not e then
        local p = buf:sub(1, 5)
        if ("HTTP/"):sub(1, #p) ~= p then
            return false, "not an HTTP response: " .. buf:sub(1, 60)
        end
        return nil
    end
    local head = buf:sub(1, e - 1)
    local status_line = head:match("^[^\r\n]*")
    local version, code, reason = status_line:match("^HTTP/(%d%.%d) (%d%d%d) ?(.*)$")
    if not version then return false, "bad status line: " .. status_line end
    code = tonumber(code)
    local headers, list = {}, {}
    for line in head:sub(#status_line + 3):gmatch("[^\r\n]+") do
        local name, value = line:match("^([^:]+):(.*)$")
        if name then
            name, value = name:lower(), trim(value)
            list[#list + 1] = { name, value }
            if headers[name] then
                headers[name] = headers[name] .. ", " .. value
            else
                headers[name] = value
            end
        end
    end
    local pos = e + 4
    local body
    local te = headers["transfer-encoding"]
    if (code >= 100 and code < 200) or code == 204 or code == 304 or opts.head then
        body = ""
    elseif te and te:lower():find("chunked", 1, true) then
        local parts = {}
        while true do
            local le = buf:find("\r\n", pos, true)
            if not le then return nil end
            local size = tonumber(buf:sub(pos, le - 1):match("^(%x+)"), 16)
            if not size then return false, "bad chunk size line: " .. buf:sub(pos, le - 1) end
            pos = le + 2
            if size == 0 then
                -- trailers up to an empty line
                local te2 = buf:find("\r\n", pos, true)
                while te2 and te2 ~= pos do
                    pos = te2 + 2
                    te2 = buf:find("\r\n", pos, true)
                end
                if not te2 then return nil end
                pos = te2 + 2
                break
            end
            if #buf < pos + size + 1 then return nil end
            parts[#parts + 1] = buf:sub(pos, pos + size - 1)
            pos = pos + size + 2
        end
        body = table.concat(parts)
    elseif headers["content-length"] then
        local cl = tonumber(headers["content-length"]:match("^%d+"))
        if not cl then return false, "bad content-length: " .. headers["content-length"] end
        if #buf < pos + cl - 1 then return nil end
        body = buf:sub(pos, pos + cl - 1)
        pos = pos + cl
    else
        if not opts.closed then return nil, true end
        body = buf:sub(pos)
        pos = #buf + 1
    end
    return {
        status = code,
        version = version,
        reason = reason,
        status_line = status_line,
        headers = headers,
        header_list = list,
        body = body,
        raw = buf:sub(1, pos - 1),
    }, buf:sub(pos)
end
M.parse_response = parse_response

-- Parses every complete response in data. opts.head[i] = true marks the i-th as a HEAD answer
-- (1xx interim responses are counted too). Returns the list and the unparsed rest.
function M.parse_responses(data, opts)
    opts = opts or {}
    local out, rest = {}, data
    while #rest > 0 do
        local r, r2 = parse_response(rest, {
            head = opts.head and opts.head[#out + 1],
            closed = opts.closed ~= false,
        })
        if not r then break end
        out[#out + 1] = r
        rest = r2
    end
    return out, rest
end

-- Number of status lines anywhere in data (a cross-check for "never two answers").
function M.count_status_lines(data)
    local n = 0
    for _ in ("\n" .. data):gmatch("\nHTTP/%d%.%d %d%d%d") do n = n + 1 end
    return n
end

---------------------------------------------------------------------------------------------
-- raw connections (luasocket)

local Conn = {}
Conn.__index = Conn

local function connect(host, port, opts)
    opts = opts or {}
    local bare = host:gsub("^%[(.*)%]$", "%1")
    local sock = bare:find(":", 1, true) and socket.tcp6() or (socket.tcp4 or socket.tcp)()
    if opts.rcvbuf then sock:setoption("recv-buffer-size", opts.rcvbuf) end
    sock:settimeout(opts.connect_timeout or 2)
    local ok, err = sock:connect(bare, port)
    if not ok then
        sock:close()
        return nil, err
    end
    sock:setoption("tcp-nodelay", true)
    return setmetatable({ sock = sock, buf = "", closed = false, eof = false }, Conn)
end
M.connect = connect

-- Sends all of bytes. Returns true, or nil and the error ("closed", "timeout", ...).
function Conn:send(bytes)
    self.sock:settimeout(5)
    local i = 1
    while i <= #bytes do
        local last, err, partial = self.sock:send(bytes, i)
        if not last then
            if err ~= "timeout" then return nil, err end
            last = partial
        end
        i = last + 1
    end
    return true
end

-- Waits up to timeout for more bytes; appends them to self.buf.
-- Returns the new bytes ("" on timeout) and whether the peer closed (EOF or reset).
function Conn:fill(timeout)
    if self.eof then return "", true end
    if not self.sock:dirty() then
        local r = socket.select({ self.sock }, nil, math.max(timeout, 0))
        if not r or #r == 0 then return "", false end
    end
    self.sock:settimeout(0)
    local data, err, partial = self.sock:receive(65536)
    data = data or partial or ""
    self.buf = self.buf .. data
    if err and err ~= "timeout" then
        self.eof = true
        self.close_reason = err -- "closed" or "connection reset by peer"
    end
    return data, self.eof
end

-- Reads until the peer closes or timeout. Returns everything buffered and closed.
function Conn:read_until_close(timeout)
    local deadline = now() + (timeout or 2)
    while not self.eof do
        local left = deadline - now()
        if left <= 0 then break end
        self:fill(left)
    end
    local data = self.buf
    self.buf = ""
    return data, self.eof
end

-- Reads for up to timeout (or until close) and returns whatever arrived.
function Conn:read_for(timeout)
    return self:read_until_close(timeout)
end

-- Reads exactly one response. opts: {head = true} for a HEAD answer; timeout (s).
-- Returns resp, or nil and "closed" / "timeout" / a parse error.
function Conn:read_response(opts)
    opts = opts or {}
    local deadline = now() + (opts.timeout or 3)
    while true do
        local r, rest = parse_response(self.buf, { head = opts.head, closed = self.eof })
        if r then
            self.buf = rest
            return r
        elseif r == false then
            return nil, rest
        end
        if self.eof then return nil, "closed" end
        local left = deadline - now()
        if left <= 0 then return nil, "timeout" end
        self:fill(left)
    end
end

-- Waits up to timeout for the peer to close. Returns closed, extra bytes received meanwhile.
function Conn:wait_closed(timeout)
    local deadline = now() + (timeout or 2)
    while not self.eof do
        local left = deadline - now()
        if left <= 0 then break end
        self:fill(left)
    end
    local extra = self.buf
    self.buf = ""
    return self.eof, extra
end

-- True when the peer has not closed the connection (checks without waiting long).
function Conn:is_open(wait)
    self:fill(wait or 0)
    return not self.eof
end

function Conn:close()
    if not self.closed then
        self.closed = true
        self.sock:close()
    end
end

---------------------------------------------------------------------------------------------
-- the server object

local Server = {}
Server.__index = Server

local running = {} -- servers not stopped yet, killed at the end of the run in any case

local function kill_pid(pid, sig)
    if pid and tostring(pid):match("^%d+$") then
        os.execute("kill -" .. (sig or "TERM") .. " " .. pid .. " 2>/dev/null")
    end
end

do -- make sure no server outlives the busted run, whatever happened in the specs
    local ok, busted = pcall(require, "busted")
    if ok and type(busted) == "table" and busted.subscribe then
        busted.subscribe({ "exit" }, function()
            for srv in pairs(running) do
                kill_pid(srv.pid, "KILL")
                running[srv] = nil
            end
            return nil, true
        end)
    end
end

local DEFAULT_APP = [[
local k = require "khamsin"
k.get("/", function() return "ok" end)
]]

local function shell_args(list)
    local out = {}
    for i, a in ipairs(list) do out[i] = sh_quote(a) end
    return table.concat(out, " ")
end

local function env_prefix(env)
    if not env or next(env) == nil then return "" end
    local parts = { "env" }
    for k, v in pairs(env) do parts[#parts + 1] = sh_quote(k .. "=" .. v) end
    return table.concat(parts, " ") .. " "
end

local function check_bin()
    local bin = M.bin()
    if exec_status("test -x " .. sh_quote(bin)) ~= 0 then
        error("khamsin binary not found or not executable at " .. bin
            .. " (build it with cmake into build/, or set KHAMSIN_BIN)", 3)
    end
    return bin
end

-- The server runs through a symlink <dir>/kh-under-test, so that its process name and
-- command line do not contain "khamsin": other people's `pkill khamsin` (seen on the shared
-- machine) must not stop a server in the middle of a spec. KHAMSIN_SPEC_NO_ALIAS=1 disables it.
local function alias_bin(bin, dir)
    local v = os.getenv("KHAMSIN_SPEC_NO_ALIAS")
    if v and v ~= "" and v ~= "0" then return bin end
    local abs = bin
    if abs:sub(1, 1) ~= "/" then abs = cwd() .. "/" .. abs end
    local link = dir .. "/kh-under-test"
    if exec_status("ln -s " .. sh_quote(abs) .. " " .. sh_quote(link)) ~= 0 then return bin end
    return link
end

-- Parses the "listening on HOST:PORT (tcp)" and "... (tls)" lines of a log text; TLS
-- listeners have tls = true. kind = "quic" lists the "(quic)" lines (--http3) instead.
local function listening_lines(log, kind)
    local out = {}
    for host, port, k in log:gmatch("listening on (%S+):(%d+) %((%a+)%)") do
        if (kind == nil and (k == "tcp" or k == "tls")) or k == kind then
            out[#out + 1] = { host = host, port = tonumber(port), addr = host .. ":" .. port,
                tls = k ~= "tcp", quic = k == "quic" }
        end
    end
    return out
end
M.listening_lines = listening_lines

-- server.start{app = "<lua source>", args = {...}, workers = 1, env = {...},
--              listen = {"127.0.0.1:0", ...}, dev = false, expect_errors = {"pattern", ...},
--              start_timeout = 30, tls = nil|true|false, no_wait = false}
-- TLS: tls = true serves only TLS (--tls-self-signed on 127.0.0.1:0). Without `listen` and
-- `tls`, a server has a cleartext listener (srv.listens[1]) and a TLS one after it, so that
-- every spec can run its requests over "h1+tls" too; tls = false leaves TLS out.
-- srv.tls_listens lists the TLS listeners.
-- HTTP/3: such a default server also has --http3 (QUIC on the TLS listener's port, srv.quic_listens)
-- so that "h3" is one of each_protocol's protocols; http3 = false leaves it out, and so does a
-- $KHAMSIN_PROTOS without h3. http3 = true adds it to any server with a TLS listener.
function M.start(opts)
    opts = opts or {}
    local bin = check_bin()
    local dir = mktempdir()
    local self = setmetatable({
        dir = dir,
        app_path = dir .. "/app.lua",
        log_path = dir .. "/stderr.log",
        out_path = dir .. "/stdout.log",
        pid_path = dir .. "/pid",
        exit_path = dir .. "/exit",
        expected_errors = {},
        allowed_ranges = {},
        host = "127.0.0.1",
        opts = opts,
    }, Server)
    for _, p in ipairs(opts.expect_errors or {}) do self.expected_errors[#self.expected_errors + 1] = p end
    write_file(self.app_path, opts.app or DEFAULT_APP)

    local listen = opts.listen or { "127.0.0.1:0" }
    local args = {}
    local has_cert = false
    for _, a in ipairs(opts.args or {}) do
        if a == "--tls-cert" or a == "--tls-self-signed" then has_cert = true end
    end
    local http3 = opts.http3
    if http3 == nil then http3 = opts.tls == nil and not opts.listen and not has_cert and M.wants("h3") end
    if opts.tls == true then
        if not opts.listen then listen = { "tls://127.0.0.1:0" } end
    elseif opts.tls == nil and not opts.listen and not has_cert then
        listen = { "tcp://127.0.0.1:0", "tls://127.0.0.1:0" }
    end
    for _, l in ipairs(listen) do
        if l:match("^tls://") or l:match("^https://") then
            if not has_cert then
                args[#args + 1] = "--tls-self-signed"
                has_cert = true
            end
        end
    end
    for _, l in ipairs(listen) do
        args[#args + 1] = "--listen"
        args[#args + 1] = l
    end
    if http3 then args[#args + 1] = "--http3" end
    args[#args + 1] = "--workers"
    args[#args + 1] = tostring(opts.workers or 1)
    if opts.dev then args[#args + 1] = "--dev" end
    for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
    args[#args + 1] = self.app_path
    self.argv = args

    self.bin = bin
    local cmd = env_prefix(opts.env) .. sh_quote(alias_bin(bin, dir)) .. " " .. shell_args(args)
    local wrapper = string.format("%s </dev/null >%s 2>%s & echo $! >%s; wait $!; echo $? >%s",
        cmd, sh_quote(self.out_path), sh_quote(self.log_path), sh_quote(self.pid_path),
        sh_quote(self.exit_path))
    os.execute("sh -c " .. sh_quote(wrapper) .. " </dev/null >/dev/null 2>&1 &")

    self.pid = wait_until(2, function()
        local p = read_file(self.pid_path)
        return p and p:match("^(%d+)")
    end)
    if not self.pid then
        rmtempdir(dir)
        error("could not start " .. bin, 2)
    end
    running[self] = true
    -- no_wait: return once the process runs, before any "listening on" line (with a fixed
    -- --listen port, M.free_port: a spec that talks to a server still loading some workers)
    if opts.no_wait then
        self.listens = {}
        return self
    end

    -- wait for one "listening on" line per --listen address
    local want = #listen
    -- start_timeout: the ASan build with --tls-self-signed took over 5 s to listen on the
    -- 2-core box at load 20+; a server that fails to start exits, which ends the wait at once
    local found = wait_until(opts.start_timeout or 30, function()
        local lines = listening_lines(read_file(self.log_path) or "")
        if #lines >= want then return lines end
        if self:exit_code() then return false end
    end)
    if not found then
        local code = self:exit_code()
        local log = self:log()
        kill_pid(self.pid, "KILL")
        running[self] = nil
        self.stopped = true
        -- QUIC takes the TLS listener's port number on UDP, where another process may hold it
        -- (the kernel picked the number for TCP): a new start picks another
        if http3 and log:find("%(quic%): Address already in use") and (opts.quic_retries or 0) < 3 then
            rmtempdir(dir)
            local again = {}
            for k, v in pairs(opts) do again[k] = v end
            again.quic_retries = (opts.quic_retries or 0) + 1
            return M.start(again)
        end
        error(string.format("khamsin did not report %d listening line(s) (%s); argv: %s\n--- log:\n%s",
            want, code and ("exited with code " .. code) or "timed out", table.concat(args, " "), log), 2)
    end
    self.listens = found
    self.tls_listens = {}
    for _, l in ipairs(found) do
        if l.tls then self.tls_listens[#self.tls_listens + 1] = l end
    end
    self.quic_listens = {}
    if http3 then -- one "(quic)" line per TLS listener, each in a write of its own
        self.quic_listens = wait_until(opts.start_timeout or 30, function()
            local q = listening_lines(read_file(self.log_path) or "", "quic")
            if #q >= #self.tls_listens then return q end
        end) or error("khamsin started with --http3 but reported no QUIC listener\n--- log:\n" .. self:log(), 2)
    end
    self.port = found[1].port
    self.host = found[1].host
    return self
end

function Server:log()
    return read_file(self.log_path) or ""
end

function Server:stdout()
    return read_file(self.out_path) or ""
end

function Server:log_size()
    return #self:log()
end

-- Waits up to timeout for pattern (a Lua pattern) in the log after byte offset `from`.
-- Returns the first capture/match, or nil.
function Server:wait_log(pattern, timeout, from)
    return wait_until(timeout or 2, function()
        return self:log():sub((from or 0) + 1):match(pattern)
    end)
end

-- Allows [error] lines matching pattern for the rest of this server's life.
function Server:expect_error(pattern)
    self.expected_errors[#self.expected_errors + 1] = pattern
end

-- Runs fn (which provokes an error), waits until at least `count` [error] lines appeared
-- (default 1, up to `timeout` s), and allows every log line written meanwhile.
-- Returns the log text written since fn started.
function Server:capture_errors(fn, count, timeout)
    local mark = self:log_size()
    fn()
    count = count or 1
    wait_until(timeout or 2, function()
        local n = 0
        for _ in self:log():sub(mark + 1):gmatch("%[error%]") do n = n + 1 end
        return n >= count
    end)
    sleep(0.05) -- let a multi-line traceback finish
    local size = self:log_size()
    self.allowed_ranges[#self.allowed_ranges + 1] = { mark, size }
    return self:log():sub(mark + 1, size)
end

-- [error] lines not allowed by expect_error patterns or capture_errors ranges.
function Server:unexpected_errors()
    local log = self:log()
    local bad = {}
    local pos = 1
    while pos <= #log do
        local eol = log:find("\n", pos, true) or (#log + 1)
        local line = log:sub(pos, eol - 1)
        if line:find("[error]", 1, true) then
            local ok = false
            for _, r in ipairs(self.allowed_ranges) do
                if pos - 1 >= r[1] and pos - 1 < r[2] then ok = true break end
            end
            if not ok then
                for _, p in ipairs(self.expected_errors) do
                    if line:find(p) then ok = true break end
                end
            end
            if not ok then bad[#bad + 1] = line end
        end
        pos = eol + 1
    end
    return bad
end

-- The server's own time (seconds of the day, from the timestamp of its log line) of the first
-- log line matching pattern (after byte offset `from`), or nil.
function Server:log_time(pattern, from)
    for line in self:log():sub((from or 0) + 1):gmatch("[^\n]+") do
        if line:find(pattern) then
            local h, m, sec = line:match("^%d+%-%d+%-%d+T(%d+):(%d+):([%d.]+)Z")
            if h then return tonumber(h) * 3600 + tonumber(m) * 60 + tonumber(sec) end
        end
    end
end

-- Seconds from the log's "SIGTERM|SIGINT: stopping" line to its "main: stopped" line, by the
-- server's clock: how long the engine's graceful stop took, without the process's exit after it
-- (ASan's leak check: seconds on a loaded box). Raises when either line is missing.
function Server:stop_seconds()
    local t0 = self:log_time("%] main: SIG%u+: stopping")
    local t1 = self:log_time("%] main: stopped$")
    assert(t0 and t1, "no 'stopping' / 'stopped' lines in the log:\n" .. self:log())
    if t1 < t0 then t1 = t1 + 86400 end -- across midnight
    return t1 - t0, t0
end

function Server:exit_code()
    local s = read_file(self.exit_path)
    return s and tonumber(s:match("^(%d+)"))
end

function Server:signal(sig)
    self.signaled = true
    kill_pid(self.pid, sig or "TERM")
end

-- Waits up to timeout seconds for the server to exit; returns its exit code (128+N for a
-- signal) or nil on timeout. Once the log says "main: stopped" the engine's stop is over and
-- only the process's exit is left, where ASan's leak check walks the heap: that took over 3 s
-- on the 2-core box at load 20+, so it gets up to 30 s more (a stop that hangs never logs
-- "stopped" and still times out at `timeout`).
function Server:wait_exit(timeout)
    local code = wait_until(timeout or 5, function() return self:exit_code() end)
    if code == nil and self:log():find("%] main: stopped\n") then
        code = wait_until(30, function() return self:exit_code() end)
    end
    if code then
        self.exited = true
        running[self] = nil
    end
    return code
end

-- Stops the server: SIGTERM, then SIGKILL after opts.stop_timeout (3 s; see wait_exit for the
-- exit after "main: stopped"). Always kills it.
-- Fails (raises) when the log has unexpected [error] lines, a sanitizer report, when the
-- server had died on its own, or when it did not exit cleanly on SIGTERM.
function Server:stop()
    if self.stopped then return end
    self.stopped = true
    local problems = {}
    local code = self:exit_code()
    if code ~= nil then
        if not self.exited and not self.signaled and not self.opts.may_exit then
            problems[#problems + 1] = "khamsin exited by itself with code " .. code
        end
    else
        self:signal("TERM")
        code = self:wait_exit(self.opts.stop_timeout or 3)
        if code == nil then
            self:signal("KILL")
            self:wait_exit(2)
            problems[#problems + 1] = "khamsin did not exit within "
                .. (self.opts.stop_timeout or 3) .. " s of SIGTERM (killed)"
        elseif code ~= 0 then
            problems[#problems + 1] = "khamsin exited with code " .. code .. " on SIGTERM"
        end
    end
    kill_pid(self.pid, "KILL") -- harmless when gone; never leave it behind
    running[self] = nil

    local log = self:log()
    local bad = self:unexpected_errors()
    if #bad > 0 then
        problems[#problems + 1] = "unexpected [error] lines in the log:\n  " .. table.concat(bad, "\n  ")
    end
    if log:find("AddressSanitizer", 1, true) or log:find("LeakSanitizer", 1, true)
        or log:find("runtime error:", 1, true) then
        problems[#problems + 1] = "sanitizer report in the log"
    end
    if #problems > 0 then
        error(table.concat(problems, "\n") .. "\n(server files kept in " .. self.dir .. ")\n--- log tail:\n"
            .. log:sub(-3000), 2)
    end
    rmtempdir(self.dir)
end

function Server:kill()
    self:signal("KILL")
    self:wait_exit(2)
    self.stopped = true
    running[self] = nil
    rmtempdir(self.dir)
end

function Server:url(path, listen)
    local l = listen or self.listens[1]
    return (l.tls and "https://" or "http://") .. l.host .. ":" .. l.port .. (path or "/")
end

---------------------------------------------------------------------------------------------
-- requests through curl: srv:request{method, path, headers = {...}, body, proto = "h1"}
-- Returns {status = n, headers = {lower-case name = value}, body = s, header_list = {...}}
-- plus curl_exit / err when curl failed.

local CURL_PROTO = {
    h1 = { "--http1.1" },
    h2c = { "--http2-prior-knowledge" }, -- HTTP/2 over cleartext, no Upgrade (RFC 9113 §3.3)
    ["h1+tls"] = { "--http1.1", "-k" }, -- -k: the spec servers use --tls-self-signed
    h2 = { "--http2", "-k" }, -- HTTP/2 over TLS, by ALPN
}
local PROTO_TLS = { ["h1+tls"] = true, h2 = true, h3 = true }

-- "h3": khamsin's own HTTP/3 client (core/tools/kh_h3get.c, built beside the binary; Debian's
-- curl has no HTTP/3). It takes curl's -X -H -d @FILE -D -o -F --compressed, never verifies
-- the certificate (like -k) and sends no header of its own (curl adds User-Agent and Accept).
CURL_PROTO.h3 = {}
function M.h3get_bin()
    return os.getenv("KHAMSIN_H3GET") or (M.bin():gsub("[^/]+$", "kh-h3get"))
end
local H3_CURL_ARGS = { ["--compressed"] = 0, ["-F"] = 1 } -- curl_args kh-h3get knows (and how many values)

function Server:request(r)
    r = r or {}
    local proto = r.proto or "h1"
    local proto_args = CURL_PROTO[proto]
    if not proto_args then error("protocol not supported by the spec helper yet: " .. proto, 2) end
    local l = r.listen
    if not l and proto == "h3" then
        l = self.quic_listens and self.quic_listens[1]
        if not l then error("no QUIC listener for proto h3 (a default server.start, or http3 = true)", 2) end
    elseif not l then
        local want_tls = PROTO_TLS[proto] or false
        for _, cand in ipairs(self.listens) do
            if (cand.tls or false) == want_tls then l = cand break end
        end
        if not l then
            error(string.format("no %s listener for proto %s (server.start{tls = ...})",
                want_tls and "TLS" or "cleartext", proto), 2)
        end
    end
    local url = (PROTO_TLS[proto] and "https://" or "http://") .. (r.host or l.host) .. ":"
        .. (r.port or l.port) .. (r.path or "/")
    local n = (self.nreq or 0) + 1
    self.nreq = n
    local hdr_path = string.format("%s/curl%d.hdr", self.dir, n)
    local body_path = string.format("%s/curl%d.body", self.dir, n)
    local err_path = string.format("%s/curl%d.err", self.dir, n)
    local in_path = string.format("%s/curl%d.in", self.dir, n)

    local h3 = proto == "h3"
    local args = { "curl", "-s", "-S", "-g", "--path-as-is", "--noproxy", "*",
        "--max-time", tostring(r.timeout or 5), "-D", hdr_path, "-o", body_path }
    -- (an ASan build's kh-h3get spends half its CPU in LeakSanitizer's exit scan: a test
    -- client's leaks are not what the specs check, so that scan is off for it)
    if h3 then
        local asan = os.getenv("ASAN_OPTIONS")
        asan = "ASAN_OPTIONS=" .. (asan and asan ~= "" and asan .. ":" or "") .. "detect_leaks=0"
        args = { "env", asan, M.h3get_bin(), "--timeout", tostring(r.timeout or 5),
            "-D", hdr_path, "-o", body_path }
    end
    for _, a in ipairs(proto_args) do args[#args + 1] = a end
    local method = (r.method or "GET"):upper()
    if method == "HEAD" and not h3 then
        args[#args + 1] = "-I"
    elseif method ~= "GET" or r.body then
        args[#args + 1] = "-X"
        args[#args + 1] = method
    end
    local has_expect = false
    -- headers: {name = value} or a list {{name, value}, ...} (to repeat a name)
    local hlist = {}
    if r.headers and r.headers[1] then
        hlist = r.headers
    else
        for name, value in pairs(r.headers or {}) do hlist[#hlist + 1] = { name, value } end
    end
    for _, h in ipairs(hlist) do
        local name, value = h[1], h[2]
        if name:lower() == "expect" then has_expect = true end
        args[#args + 1] = "-H"
        if value == false then
            args[#args + 1] = name .. ":" -- remove a header curl would send
        elseif value == "" then
            args[#args + 1] = name .. ";" -- send an empty header
        else
            args[#args + 1] = name .. ": " .. value
        end
    end
    if not has_expect and not h3 then
        args[#args + 1] = "-H"
        args[#args + 1] = "Expect:" -- no implicit 100-continue from curl
    end
    if r.body then
        write_file(in_path, r.body)
        args[#args + 1] = "--data-binary"
        args[#args + 1] = "@" .. in_path
    end
    local ca = r.curl_args or {}
    for i, a in ipairs(ca) do
        if h3 and H3_CURL_ARGS[a] == nil and H3_CURL_ARGS[ca[i - 1]] ~= 1 then
            error("curl argument not supported by kh-h3get (proto h3): " .. a, 2)
        end
        args[#args + 1] = a
    end
    args[#args + 1] = url

    local code = exec_status(shell_args(args) .. " 2>" .. sh_quote(err_path))
    local res = { curl_exit = code, headers = {}, header_list = {}, body = "" }
    if code ~= 0 then res.err = (read_file(err_path) or ""):gsub("%s+$", "") end
    local hdr = read_file(hdr_path) or ""
    -- the last header block wins (after 1xx interim responses)
    local last
    for block in (hdr .. "\r\n\r\n"):gmatch("(HTTP/.-)\r\n\r\n") do last = block end
    if last then
        local status_line = last:match("^[^\r\n]*")
        res.status_line = status_line
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
    if method ~= "HEAD" then res.body = read_file(body_path) or "" end
    os.remove(hdr_path); os.remove(body_path); os.remove(err_path); os.remove(in_path)
    return res
end

---------------------------------------------------------------------------------------------
-- raw socket access

-- srv:raw_conn{listen = srv.listens[i], rcvbuf = n} -> conn (or nil, err)
function Server:raw_conn(opts)
    opts = opts or {}
    local l = opts.listen or self.listens[1]
    return connect(opts.host or l.host, opts.port or l.port, opts)
end

-- srv:raw(bytes, {timeout = 2, wait_close = true, responses = n}) -> data, closed
-- Sends bytes on a new connection and reads until the server closes (or timeout). With
-- responses = n, stops as soon as n complete responses arrived (wait_close = false).
function Server:raw(bytes, opts)
    opts = opts or {}
    local c, err = self:raw_conn(opts)
    if not c then error("connect failed: " .. tostring(err), 2) end
    if bytes and #bytes > 0 then
        local ok, serr = c:send(bytes)
        if not ok then c.send_error = serr end
    end
    local timeout = opts.timeout or 2
    local data, closed
    if opts.responses then
        local deadline = now() + timeout
        while true do
            local list = M.parse_responses(c.buf, { closed = c.eof, head = opts.head })
            if #list >= opts.responses or c.eof then break end
            local left = deadline - now()
            if left <= 0 then break end
            c:fill(left)
        end
        if opts.wait_close then
            data, closed = c:read_until_close(math.max(deadline - now(), 0.01))
        else
            data, closed = c.buf, c.eof
        end
    elseif opts.wait_close == false then
        data, closed = c:read_for(timeout)
    else
        data, closed = c:read_until_close(timeout)
    end
    c:close()
    return data, closed
end

-- One request on a fresh connection with Connection: close; returns the parsed response
-- (or nil, err). r = {method, path, headers = {{name, value}, ...} or {name = value}, body,
-- version = "1.1", host = "x"}
function Server:raw_request(r)
    r = r or {}
    local lines = { string.format("%s %s HTTP/%s", r.method or "GET", r.path or "/", r.version or "1.1") }
    lines[#lines + 1] = "Host: " .. (r.host_header or "localhost")
    local hs = r.headers or {}
    if hs[1] then
        for _, h in ipairs(hs) do lines[#lines + 1] = h[1] .. ": " .. h[2] end
    else
        for k, v in pairs(hs) do lines[#lines + 1] = k .. ": " .. v end
    end
    if r.body then lines[#lines + 1] = "Content-Length: " .. #r.body end
    if not r.keepalive then lines[#lines + 1] = "Connection: close" end
    local req = table.concat(lines, "\r\n") .. "\r\n\r\n" .. (r.body or "")
    local c, err = self:raw_conn(r)
    if not c then return nil, err end
    c:send(req)
    local resp, rerr = c:read_response({ timeout = r.timeout or 3, head = (r.method == "HEAD") })
    c:close()
    return resp, rerr
end

---------------------------------------------------------------------------------------------
-- one-shot runs (bad scripts, --print-limits, --help)

-- server.run{app = "<lua source>" | nil, args = {...}, timeout = 5, env = {...}}
-- -> {code = n, stdout = s, stderr = s, app_path = p}; code 124 means it timed out.
function M.run(opts)
    opts = opts or {}
    local bin = check_bin()
    local dir = mktempdir()
    local args = {}
    for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
    local app_path
    if opts.app then
        app_path = dir .. "/app.lua"
        write_file(app_path, opts.app)
        args[#args + 1] = app_path
    end
    local out, err = dir .. "/stdout", dir .. "/stderr"
    local cmd = string.format("%stimeout -k 1 %s %s %s </dev/null >%s 2>%s", env_prefix(opts.env),
        tostring(opts.timeout or 5), sh_quote(alias_bin(bin, dir)), shell_args(args), sh_quote(out), sh_quote(err))
    local code = exec_status(cmd)
    local res = { code = code, stdout = read_file(out) or "", stderr = read_file(err) or "", app_path = app_path,
        dir = dir }
    rmtempdir(dir)
    return res
end

---------------------------------------------------------------------------------------------
-- protocols and environment

-- Calls fn(proto) for every protocol srv:request can speak: "h1", "h1+tls", "h2c", "h2", "h3"
-- (HTTP/3 through kh-h3get, on the QUIC listener of a default server.start).
-- $KHAMSIN_PROTOS (comma list) narrows the set.
M.protocols = { "h1", "h1+tls", "h2c", "h2", "h3" }

-- True when proto is among the protocols of this run ($KHAMSIN_PROTOS, else all).
function M.wants(proto)
    local only = os.getenv("KHAMSIN_PROTOS")
    return not only or only == "" or ("," .. only .. ","):find("," .. proto .. ",", 1, true) ~= nil
end

function M.each_protocol(fn)
    for _, p in ipairs(M.protocols) do
        if M.wants(p) then fn(p) end
    end
end

-- True when ::1 is configured (an IPv6 socket can bind to it).
-- A loopback TCP port free right now (bound, read, released): for peers the spec starts itself.
function M.free_port()
    local s = assert(socket.bind("127.0.0.1", 0))
    local _, port = s:getsockname()
    s:close()
    return tonumber(port)
end

function M.has_ipv6_loopback()
    if not socket.tcp6 then return false end
    local s = socket.tcp6()
    if not s then return false end
    local ok = s:bind("::1", 0)
    s:close()
    return ok == 1 or ok == true
end

-- An HTTP-date (RFC 9110 §5.6.7, IMF-fixdate).
function M.is_http_date(s)
    return type(s) == "string" and s:match("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$") ~= nil
end

---------------------------------------------------------------------------------------------
-- shared assertions

-- Sends bytes on a new connection and asserts the server refused them: exactly one response,
-- with status `code` (or one of a list of codes), `Connection: close`, a short text/plain body whose length matches
-- Content-Length, and the server closed the connection. Returns the response.
function M.assert_refused(srv, bytes, code, opts)
    local luassert = require "luassert"
    local data, closed = srv:raw(bytes, opts)
    local list = M.parse_responses(data)
    local r = list[1]
    luassert(r, "no response to a malformed request (closed = " .. tostring(closed) .. "); got: "
        .. string.format("%q", data:sub(1, 200)))
    if type(code) == "table" then -- any of several codes
        local ok = false
        for _, c in ipairs(code) do ok = ok or c == r.status end
        luassert(ok, "status " .. r.status .. " not one of " .. table.concat(code, ", "))
        code = r.status
    else
        luassert.are.equal(code, r.status, "status line: " .. r.status_line)
    end
    luassert.is_true(closed, "the server did not close the connection after " .. code)
    luassert.are.equal(1, M.count_status_lines(data), "more than one response: " .. data:sub(1, 400))
    luassert.are.equal("close", (r.headers.connection or ""):lower(), "no Connection: close on " .. code)
    luassert.truthy((r.headers["content-type"] or ""):match("^text/plain"),
        "error body is not text/plain: " .. tostring(r.headers["content-type"]))
    luassert.are.equal(tostring(#r.body), r.headers["content-length"])
    return r
end

M.unpack = unpack
return M
