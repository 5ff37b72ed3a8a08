-- khamsin.multipart: req:multipart(opts), a multipart/form-data body (RFC 7578) read part by
-- part: each part's headers, then its data in chunks. Loaded on the first req:multipart().
-- The parser is core/kh_multipart.c (sans-io, fuzzed); this file feeds it chunks and turns its
-- events into parts. The chunks come from one function, `source`: req:body_reader(), so parts
-- stream as the body arrives (under body_window); a route declared { stream_body = true } takes
-- uploads past body_bytes, bounded by max_total_bytes (spec/multipart_stream_spec.lua).
-- Limits (400 with the reason past each): opts.max_parts (limit multipart_parts),
-- opts.max_header_bytes (multipart_header_bytes), opts.max_part_bytes (multipart_part_bytes),
-- opts.max_total_bytes (body_bytes). reader:all() keeps file parts in memory (opts.files =
-- "memory", the default) or writes each to a temp file in opts.tmp_dir (default $TMPDIR or
-- /tmp) through the k.blocking pool, never on the loop; those files are removed when the
-- handler returns (move them with os.rename to keep one).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, error, pairs, lower, find, sub, gsub, concat, tonumber, char, setmetatable, rawget,
    rawset = type, error, pairs, string.lower, string.find, string.sub, string.gsub, table.concat,
    tonumber, string.char, setmetatable, rawget, rawset

local M = {}

local function bad(reason) error(errors.http(400, reason), 0) end

-- `; name=value` parameters after a media type or disposition: token or quoted-string values
-- (backslash escapes undone), names lower-cased. Returns the first token and the table, or nil.
local function params(s)
    local head, pos = s:match("^%s*([^;%s]+)%s*()")
    if not head then return nil end
    local out = {}
    while pos <= #s do
        local np = s:match("^;%s*()", pos)
        if not np then return nil end
        pos = np
        if pos > #s then break end -- a trailing ';'
        local name, p2 = s:match("^([!#$%%&'*+%-.^_`|~%w]+)%s*=%s*()", pos)
        if not name then return nil end
        local val
        if sub(s, p2, p2) == '"' then
            local buf, i = {}, p2 + 1
            while true do
                local c = sub(s, i, i)
                if c == "" then return nil end
                if c == '"' then break end
                if c == "\\" then i = i + 1; c = sub(s, i, i) end
                buf[#buf + 1] = c
                i = i + 1
            end
            val, pos = concat(buf), i + 1
        else
            val, pos = s:match("^([^;%s]*)()", p2)
        end
        out[lower(name)] = val
        pos = s:match("^%s*()", pos)
    end
    return head, out
end
M.params = params

-- filename*=UTF-8''caf%C3%A9.txt (RFC 5987 / RFC 8187)
local function ext_value(v)
    local charset, enc = v:match("^([%w!#$%%&+%-^_`{}~]+)'[^']*'(.*)$")
    if not charset or lower(charset) ~= "utf-8" then return nil end
    return (gsub(enc, "%%(%x%x)", function(h) return char(tonumber(h, 16)) end))
end

local Reader, Part = {}, {}
local reader_mt, part_mt = { __index = Reader }, { __index = Part }

-- The next event, pulling chunks from the source as the parser asks for them.
local function event(self)
    while true do
        local p = self._p
        local off, ev, a, b = p:next(self._chunk, self._off)
        self._off = off
        if ev ~= "more" then
            if ev == "error" then bad("invalid multipart body: " .. a) end
            return ev, a, b
        end
        local chunk = self._source()
        if chunk == nil then
            local ok, err = p:finish()
            if not ok then bad("invalid multipart body: " .. err) end
            return "eof"
        end
        self._chunk, self._off = chunk, 0
    end
end

-- The next part ({name, filename, content_type, headers}; the rest of the current one is
-- skipped), or nil after the last.
function Reader:part()
    if getmetatable(self) ~= reader_mt then raise("reader:part() is a method: call it with a colon") end
    local cur = self._part
    if cur then
        while cur:read() do end
    end
    if self._done then return nil end
    local headers = {}
    while true do
        local ev, a, b = event(self)
        if ev == "header" then
            local name = lower(a)
            local prev = headers[name]
            headers[name] = prev and (prev .. ", " .. b) or b
        elseif ev == "headers_end" then
            break
        elseif ev == "done" or ev == "eof" then
            self._done = true
            return nil
        end
    end
    local disp, dp = params(headers["content-disposition"] or "")
    if not disp or lower(disp) ~= "form-data" or not dp.name then
        bad("invalid multipart body: a part has no Content-Disposition: form-data with a name")
    end
    local filename = dp.filename
    if dp["filename*"] then filename = ext_value(dp["filename*"]) or filename end
    local part = setmetatable({ name = dp.name, filename = filename, headers = headers,
        content_type = headers["content-type"], _r = self }, part_mt)
    self._part = part
    return part
end

-- for part in reader:parts() do ... end
function Reader:parts()
    if getmetatable(self) ~= reader_mt then raise("reader:parts() is a method: call it with a colon") end
    return function() return self:part() end
end

-- The part's next chunk of data, or nil at its end.
function Part:read()
    if getmetatable(self) ~= part_mt then raise("part:read() is a method: call it with a colon") end
    local r = rawget(self, "_r")
    if rawget(self, "_ended") or r._part ~= self then return nil end
    local ev, a = event(r)
    if ev == "data" then return a end
    rawset(self, "_ended", true)
    r._part = nil
    if ev ~= "part_end" then bad("invalid multipart body: a part ends early") end
    return nil
end

-- The part's remaining data as one string.
function Part:data()
    if getmetatable(self) ~= part_mt then raise("part:data() is a method: call it with a colon") end
    local t = {}
    for chunk in function() return self:read() end do t[#t + 1] = chunk end
    return concat(t)
end

-- Runs on a pool thread (moved by string.dump, so no upvalues): creates a temp file with
-- O_CREAT|O_EXCL (never follows a planted link), mode 0600, appending on later calls.
local function pool_write(path, data, create)
    local ffi = require "ffi"
    if not pcall(ffi.typeof, "struct khamsin_mp_marker") then
        ffi.cdef [[
            struct khamsin_mp_marker { int x; };
            int open(const char *path, int flags, ...);
            long write(int fd, const void *buf, unsigned long n);
            int close(int fd);
            char *strerror(int errnum);
        ]]
    end
    -- O_WRONLY 01, O_CREAT 0100, O_EXCL 0200, O_APPEND 02000, O_CLOEXEC 02000000 (Linux)
    local flags = create and (1 + 64 + 128 + 524288) or (1 + 1024 + 524288)
    local fd = ffi.C.open(path, flags, ffi.new("int", 384))
    if fd < 0 then return nil, ffi.string(ffi.C.strerror(ffi.errno())) end
    local off, n = 0, #data
    while off < n do
        local w = ffi.C.write(fd, ffi.cast("const char *", data) + off, n - off)
        if w < 0 then
            local e = ffi.errno()
            ffi.C.close(fd)
            return nil, ffi.string(ffi.C.strerror(e))
        end
        off = off + w
    end
    ffi.C.close(fd)
    return true
end

local seq = 0

-- The request's temp files, removed when the handler returns (khamsin.lua's runner calls
-- M.cleanup). os.remove is one unlink(2) on the loop: the only file call not on the pool.
function M.cleanup(list)
    for i = 1, #list do os.remove(list[i]) end
end

local function add(t, k, v)
    local prev = t[k]
    if prev == nil then
        t[k] = v
    elseif type(prev) == "table" and prev[1] ~= nil then
        prev[#prev + 1] = v
    else
        t[k] = { prev, v }
    end
end

local FLUSH = 65536

-- { fields = { name = value | {values...} }, files = { name = file | {files...} } } where a
-- file is { filename, content_type, headers, size, data (memory) | path (disk) }.
function Reader:all()
    if getmetatable(self) ~= reader_mt then raise("reader:all() is a method: call it with a colon") end
    local k = require "khamsin"
    local opts = self._opts
    local disk = opts.files == "disk"
    local fields, files = {}, {}
    for part in self:parts() do
        if part.filename == nil then
            add(fields, part.name, part:data())
        else
            local f = { filename = part.filename, content_type = part.content_type,
                headers = part.headers, size = 0 }
            if disk then
                seq = seq + 1
                local path = (opts.tmp_dir or os.getenv("TMPDIR") or "/tmp") .. "/khamsin-upload-"
                    .. core.worker_id() .. "-" .. tostring(self._req.id):gsub("[^%w%-]", "")
                    .. "-" .. seq
                local ok, err = k.blocking(pool_write, path, "", true)
                if not ok then error("req:multipart: cannot create " .. path .. ": " .. tostring(err), 0) end
                local list = rawget(self._req, "_tmpfiles")
                if not list then list = {}; rawset(self._req, "_tmpfiles", list) end
                list[#list + 1] = path
                local buf, n = {}, 0
                for chunk in function() return part:read() end do
                    buf[#buf + 1], n = chunk, n + #chunk
                    f.size = f.size + #chunk
                    if n >= FLUSH then
                        ok, err = k.blocking(pool_write, path, concat(buf), false)
                        if not ok then error("req:multipart: cannot write " .. path .. ": " .. tostring(err), 0) end
                        buf, n = {}, 0
                    end
                end
                if n > 0 then
                    ok, err = k.blocking(pool_write, path, concat(buf), false)
                    if not ok then error("req:multipart: cannot write " .. path .. ": " .. tostring(err), 0) end
                end
                f.path = path
            else
                f.data = part:data()
                f.size = #f.data
            end
            add(files, part.name, f)
        end
    end
    return { fields = fields, files = files }
end

local OPTS = { max_parts = 1, max_header_bytes = 1, max_part_bytes = 1, max_total_bytes = 1,
    files = 1, tmp_dir = 1 }

function M.new(req, opts)
    if opts ~= nil and type(opts) ~= "table" then
        raise("req:multipart(opts): opts must be a table, got a " .. type(opts))
    end
    opts = opts or {}
    for key, v in pairs(opts) do
        if not OPTS[key] then raise("req:multipart(opts): unknown option '" .. tostring(key) .. "'") end
        if key == "files" then
            if v ~= "memory" and v ~= "disk" then
                raise("req:multipart(opts): files must be \"memory\" or \"disk\", got " .. tostring(v))
            end
        elseif key == "tmp_dir" then
            if type(v) ~= "string" or v == "" then raise("req:multipart(opts): tmp_dir must be a directory path") end
        elseif type(v) ~= "number" or v < 1 or v % 1 ~= 0 or (key == "max_header_bytes" and v > 1048576) then
            raise("req:multipart(opts): " .. key .. " must be a positive integer"
                .. (key == "max_header_bytes" and " up to 1048576" or "") .. ", got " .. tostring(v))
        end
    end
    local ct = req.headers["content-type"]
    local mt, cp = params(ct or "")
    if not mt or lower(mt) ~= "multipart/form-data" then
        error(errors.http(415, "req:multipart() expects a multipart/form-data body, got "
            .. (ct and ("Content-Type " .. ct) or "no Content-Type")), 0)
    end
    if not cp.boundary then bad("invalid multipart body: the Content-Type has no boundary") end
    local p, err = core.mp_new(cp.boundary, opts.max_parts or core.limit("multipart_parts"),
        opts.max_header_bytes or core.limit("multipart_header_bytes"),
        opts.max_part_bytes or core.limit("multipart_part_bytes"),
        opts.max_total_bytes or core.limit("body_bytes"))
    if not p then bad("invalid multipart body: " .. err) end
    -- the chunk source: req:body_reader(), chunks as they arrive under body_window (a route
    -- declared with {stream_body = true} takes uploads past body_bytes; max_total_bytes bounds
    -- them here)
    local source = req:body_reader()
    return setmetatable({ _p = p, _source = source, _chunk = "", _off = 0, _opts = opts,
        _req = req }, reader_mt)
end

return M
