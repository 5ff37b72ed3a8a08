-- khamsin.static: k.static(prefix, dir, opts), files under dir served at prefix.
-- Owns: the route handler; file access goes through core.fs_* (lua/kh_lua_fs.c: libuv fs
-- requests on libuv's threads, never on the loop).
-- Safety: the path is the route's decoded *splat (the engine already refused "..", "%2e%2e",
-- overlong UTF-8 and %00 with 400, core/kh_path.c); here every segment is checked again (no
-- ".", "..", NUL, '\', empty) and dotfiles are 404 unless opts.dotfiles; the file's realpath
-- must lie under dir's realpath unless opts.follow_symlinks, and the final open uses O_NOFOLLOW
-- (a link swapped in after the check is refused). Remaining race: a directory component swapped
-- for a link between the realpath check and the open (openat per component would close it).
-- Replies: Content-Type by extension, ETag (size-mtime) and Last-Modified with 304 for
-- If-None-Match / If-Modified-Since, one byte range (206, Content-Range; 416 when it starts past
-- the end; several ranges get the whole file, 200), precompressed .br/.zst/.gz siblings by
-- Accept-Encoding (with Vary). A file up to cache.file_bytes (64 KiB) is read whole and answered
-- from memory; a larger one is sent with Content-Length: on h1 cleartext by sendfile(2) from the
-- loop (core.fs_sendfile, kh_stream_send_file: no read into memory, no thread-pool hop per
-- chunk); over TLS, h2 and h3 as 64 KiB reads into one buffer per reply (core.fs_open/fs_pread),
-- each written under the stream's backpressure (res:write's seam), so a download holds about
-- stream_high_water + 64 KiB whatever the file's size.
-- Per-worker cache (opts.cache, see resolve below): realpath+stat results and small files'
-- bytes, revalidated after cache.valid seconds, so a hot small file needs no thread-pool hop.
-- opts.max_bytes (the old in-memory cap) is accepted and ignored: nothing large is read whole.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, tonumber, tostring, find, sub, lower, format, floor, concat =
    type, tonumber, tostring, string.find, string.sub, string.lower, string.format, math.floor,
    table.concat
local fs_close = core.fs_close
-- A file wait that the request's end cut short (the client left, a graceful stop's grace ended)
-- resumes with "aborted", why (kh__lua_on_abort), not false, message: raise errors.aborted, as
-- every other wait does, so the handler ends there and no "closed" is taken for a handle or for
-- bytes read.
local function fs_wait(st, ...)
    if st == "aborted" then error(errors.aborted((...)), 0) end
    return st, ...
end
local c_stat, c_realpath, c_read, c_open, c_pread = core.fs_stat, core.fs_realpath, core.fs_read,
    core.fs_open, core.fs_pread
local function fs_stat(path) return fs_wait(c_stat(path)) end
local function fs_realpath(path) return fs_wait(c_realpath(path)) end
local function fs_read(path, off, len) return fs_wait(c_read(path, off, len)) end
local function fs_open(path) return fs_wait(c_open(path)) end
local fs_sendfile = core.fs_sendfile
local respond, write, now_s = core.respond, core.stream_write, core.now
local next, ipairs, rawset, error = next, ipairs, rawset, error

local M = {}

local TEXT = "; charset=utf-8"
local TYPES = {
    html = "text/html" .. TEXT, htm = "text/html" .. TEXT, css = "text/css" .. TEXT,
    js = "text/javascript" .. TEXT, mjs = "text/javascript" .. TEXT, txt = "text/plain" .. TEXT,
    md = "text/markdown" .. TEXT, csv = "text/csv" .. TEXT, xml = "text/xml" .. TEXT,
    json = "application/json", map = "application/json", webmanifest = "application/manifest+json",
    svg = "image/svg+xml", png = "image/png", jpg = "image/jpeg", jpeg = "image/jpeg",
    gif = "image/gif", webp = "image/webp", avif = "image/avif", ico = "image/x-icon",
    woff = "font/woff", woff2 = "font/woff2", ttf = "font/ttf", otf = "font/otf",
    wasm = "application/wasm", pdf = "application/pdf", zip = "application/zip",
    gz = "application/gzip", tar = "application/x-tar", mp4 = "video/mp4", webm = "video/webm",
    mp3 = "audio/mpeg", ogg = "audio/ogg", wav = "audio/wav",
}
M.TYPES = TYPES

local function content_type(path)
    local ext = path:match("%.([%w]+)$")
    return ext and TYPES[lower(ext)] or "application/octet-stream"
end

local DAYS = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" }
local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8, Sep = 9,
    Oct = 10, Nov = 11, Dec = 12 }

local function http_date(t) return os.date("!%a, %d %b %Y %H:%M:%S GMT", t) end

-- "Sun, 06 Nov 1994 08:49:37 GMT" (IMF-fixdate) -> seconds since the epoch, or nil
local function parse_date(s)
    local d, mon, y, h, mi, se = s:match("^%a%a%a, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
    local m = MONTHS[mon or ""]
    if not m then return nil end
    y, d = tonumber(y), tonumber(d)
    -- days from civil (Howard Hinnant's algorithm)
    if m <= 2 then y = y - 1 end
    local era = floor(y / 400)
    local yoe = y - era * 400
    local mp = (m + 9) % 12
    local doy = floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
    local days = era * 146097 + doe - 719468
    return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(se)
end
M.parse_date = parse_date
local _ = DAYS

-- Accept-Encoding -> the set of codings with q > 0 (RFC 9110 §12.5.3)
local function accepted(ae)
    local ok = {}
    if not ae then return ok end
    for item in ae:gmatch("[^,]+") do
        local name, rest = item:match("^%s*([%w%-*]+)%s*(.*)$")
        if name then
            local q = rest:match("^;%s*[qQ]%s*=%s*([%d.]+)")
            ok[lower(name)] = not q or (tonumber(q) or 0) > 0
        end
    end
    return ok
end

local SIBLINGS = { { "br", ".br" }, { "zstd", ".zst" }, { "gzip", ".gz" } }

local function inside(root, real)
    return real == root or sub(real, 1, #root + 1) == root .. "/"
end

local function not_found() return 404, "Not Found\n" end

-- bytes=a-b | bytes=a- | bytes=-n -> first, last (0-based, inclusive); "multi"; "bad" (416); nil
local function parse_range(h, size)
    local spec = h:match("^%s*bytes%s*=%s*(.-)%s*$")
    if not spec then return nil end
    if find(spec, ",", 1, true) then return "multi" end
    local a, b = spec:match("^(%d*)%s*%-%s*(%d*)$")
    if not a or (a == "" and b == "") then return nil end
    if a == "" then
        local n = tonumber(b)
        if n == 0 or size == 0 then return "bad" end
        if n > size then n = size end
        return size - n, size - 1
    end
    a = tonumber(a)
    if a >= size then return "bad" end
    local last = b == "" and size - 1 or tonumber(b)
    if last < a then return nil end
    if last > size - 1 then last = size - 1 end
    return a, last
end
M.parse_range = parse_range

local function check_segments(rel, dotfiles)
    if rel == "" then return true end
    if find(rel, "\0", 1, true) or find(rel, "\\", 1, true) then return false end
    for seg in (rel .. "/"):gmatch("([^/]*)/") do
        if seg == "" or seg == "." or seg == ".." then return false end
        if not dotfiles and sub(seg, 1, 1) == "." then return false end
    end
    return true
end

-- The per-worker cache (like nginx's open_file_cache): path -> the result of realpath + stat
-- (errors too), trusted for cache.valid seconds, then checked again; a regular file's bytes are
-- kept with it when the file is at most cache.file_bytes and the cache holds less than
-- cache.total_bytes. The bytes are kept across a revalidation only when the file's identity
-- (real path, size, mtime to the nanosecond, inode, device) did not change. At most
-- cache.entries paths: when full, an arbitrary entry makes room. Keys are paths already
-- checked (check_segments) and built from the root, so the traversal rules do not change.
local function drop(st, path)
    local e = st.meta[path]
    if e then
        st.meta[path] = nil
        st.count = st.count - 1
        if e.data then st.total = st.total - #e.data end
    end
end

local function resolve(st, path)
    local c = st.cache
    local e = c and st.meta[path]
    local now = c and now_s()
    if e and now - e.t < c.valid then return e end
    local ok, real = fs_realpath(path)
    local n = { t = now, ok = false, key = path }
    if ok then
        local ok2, size, mtime, kind, nsec, ino, dev = fs_stat(real)
        if ok2 then
            n.ok, n.real, n.size, n.mtime, n.kind = true, real, size, mtime, kind
            n.id = format("%s\0%d\0%d\0%d\0%d\0%d", real, size, mtime, nsec or 0, ino or 0, dev or 0)
        end
    end
    if not c then return n end
    if e and e.id == n.id and e.data then
        n.data, n.lm = e.data, e.lm -- unchanged: keep the bytes (drop/insert keep total right)
    end
    if e then drop(st, path) end
    if st.count >= c.entries then drop(st, (next(st.meta))) end
    st.meta[path] = n
    st.count = st.count + 1
    if n.data then st.total = st.total + #n.data end
    return n
end

local CHUNK = 65536

-- Sends bytes first..first+n-1 of file with Content-Length n: on h1 cleartext the open file goes
-- to the connection (core.fs_sendfile: sendfile(2) from the loop, the head first with MSG_MORE);
-- elsewhere (TLS, h2, h3, compression) 64 KiB reads into the handle's one buffer, each written
-- under backpressure (waits while stream_high_water bytes are queued).
local function stream_file(req, res, status, headers, file, first, n)
    local h
    if req.method ~= "HEAD" and n > 0 then
        local ok
        ok, h = fs_open(file)
        if not ok then return not_found() end
    end
    local ok, err = respond(res._s, res._g, status, nil, headers, nil, "stream", n)
    if ok == false then
        if h then fs_close(h) end
        raise(err)
    end
    rawset(res, "_streaming", true)
    if ok == nil or not h then
        if h then fs_close(h) end
        return
    end
    local sent, gone = fs_sendfile(res._s, res._g, h, first, n)
    if sent or gone then -- the kernel sends it (h1 cleartext), or the client left
        fs_close(h)
        return
    end
    local off, last = first, first + n
    while off < last do
        local want = last - off
        if want > CHUNK then want = CHUNK end
        local okr, bytes = c_pread(h, off, want)
        if okr == "aborted" then
            fs_close(h) -- the read in flight finishes first (kh_lua_fs.c), then the fd is closed
            error(errors.aborted(bytes), 0)
        end
        if not okr or #bytes == 0 then
            fs_close(h)
            -- the file shrank or failed after the head promised n bytes: the reply cannot end well
            error("k.static: " .. file .. ": read failed or the file shrank during the reply", 0)
        end
        off = off + #bytes
        if not write(res._s, res._g, bytes, "wait") then break end -- the client left
    end
    fs_close(h)
end

local function serve(st, req, res)
    local rel = req.params.path or ""
    if sub(rel, -1) == "/" then rel = sub(rel, 1, -2) end -- "dir/" asks for its index
    if not check_segments(rel, st.dotfiles) then return not_found() end
    local path = rel == "" and st.root or (st.root .. "/" .. rel)
    local e = resolve(st, path)
    if not e.ok then return not_found() end
    if not st.follow and not inside(st.root, e.real) then return not_found() end
    if e.kind == "dir" then
        if not st.index then return not_found() end
        e = resolve(st, e.real .. "/" .. st.index)
        if not e.ok or (not st.follow and not inside(st.root, e.real)) then return not_found() end
    end
    if e.kind ~= "file" then return not_found() end
    local real = e.real
    local headers = { ["Content-Type"] = content_type(real), ["Accept-Ranges"] = "bytes",
        ["Cache-Control"] = st.cache_control }
    local enc = nil
    if st.precompressed then
        headers["Vary"] = "Accept-Encoding"
        local ae = req.headers["accept-encoding"]
        if ae then
            local acc = accepted(ae)
            for _, s in ipairs(SIBLINGS) do
                if acc[s[1]] then
                    local ce = resolve(st, real .. s[2])
                    if ce.ok and ce.kind == "file" and (st.follow or inside(st.root, ce.real)) then
                        e, enc = ce, s[1]
                        headers["Content-Encoding"] = enc
                        break
                    end
                end
            end
        end
    end
    local file, size, mtime = e.real, e.size, e.mtime
    local etag = format('"%x-%x%s"', size, mtime, enc and ("-" .. enc) or "")
    if not e.lm then e.lm = http_date(mtime) end
    headers["ETag"] = etag
    headers["Last-Modified"] = e.lm
    -- conditionals (RFC 9110 §13.2.2): If-None-Match wins over If-Modified-Since
    local inm = req.headers["if-none-match"]
    if inm then
        if inm == "*" or find(inm, etag, 1, true) or find(inm, "W/" .. etag, 1, true) then
            headers["Content-Type"], headers["Accept-Ranges"] = nil, nil
            headers["Content-Encoding"] = nil
            return 304, nil, headers
        end
    else
        local ims = req.headers["if-modified-since"]
        local t = ims and parse_date(ims)
        if t and mtime <= t then
            headers["Content-Type"], headers["Accept-Ranges"] = nil, nil
            headers["Content-Encoding"] = nil
            return 304, nil, headers
        end
    end
    local status, first, last = 200, 0, size - 1
    local rh = req.headers["range"]
    if rh and req.method == "GET" then
        local ir = req.headers["if-range"]
        if not ir or ir == etag or ir == headers["Last-Modified"] then
            local a, b = parse_range(rh, size)
            if a == "bad" then
                headers["Content-Range"] = "bytes */" .. size
                headers["Content-Type"] = "text/plain; charset=utf-8"
                headers["Content-Encoding"] = nil
                return 416, "Range Not Satisfiable\n", headers
            elseif type(a) == "number" then
                status, first, last = 206, a, b
                headers["Content-Range"] = format("bytes %d-%d/%d", a, b, size)
            end
        end
    end
    local n = last - first + 1
    local c = st.cache
    local data = e.data
    if not data and size <= st.small and (req.method ~= "HEAD" or size == 0) then
        -- small: read whole (one open+read+close), kept in the cache when there is room
        if size > 0 then
            local okr, bytes = fs_read(file, 0, size)
            if not okr then return not_found() end
            if #bytes ~= size then return 500, "Internal Server Error\n" end -- the file shrank
            data = bytes
        else
            data = ""
        end
        if c and st.meta[e.key] == e and st.total + size <= c.total_bytes then
            e.data = data
            st.total = st.total + size
        end
    end
    if data then
        if status == 206 then data = sub(data, first + 1, last + 1) end
        return status, data, headers
    end
    return stream_file(req, res, status, headers, file, first, n)
end

local OPTS = { index = 1, follow_symlinks = 1, dotfiles = 1, precompressed = 1, max_bytes = 1,
    cache_control = 1, cache = 1 }
local CACHE_DEFAULTS = { valid = 1, entries = 1024, file_bytes = 65536, total_bytes = 16777216 }

local ffi_ok, ffi = pcall(require, "ffi")

local function realpath_now(dir)
    if not pcall(ffi.typeof, "struct khamsin_static_marker") then
        ffi.cdef [[
            struct khamsin_static_marker { int x; };
            char *realpath(const char *path, char *resolved);
            void free(void *p);
        ]]
    end
    local p = ffi.C.realpath(dir, nil)
    if p == nil then return nil end
    local s = ffi.string(p)
    ffi.C.free(p)
    return s
end

function M.register(k, prefix, dir, opts)
    if type(prefix) ~= "string" or sub(prefix, 1, 1) ~= "/" then
        raise("k.static(prefix, dir, opts): prefix must be a path starting with '/', got "
            .. tostring(prefix))
    end
    if type(dir) ~= "string" or dir == "" then
        raise("k.static(prefix, dir, opts): dir must be a directory path, got " .. tostring(dir))
    end
    if opts ~= nil and type(opts) ~= "table" then raise("k.static: opts must be a table") end
    opts = opts or {}
    for key in pairs(opts) do
        if not OPTS[key] then raise("k.static: unknown option '" .. tostring(key) .. "'") end
    end
    if opts.index ~= nil and opts.index ~= false and (type(opts.index) ~= "string"
        or not check_segments(opts.index, true) or find(opts.index, "/", 1, true)) then
        raise("k.static: index must be a file name (\"index.html\") or false")
    end
    if opts.max_bytes ~= nil and (type(opts.max_bytes) ~= "number" or opts.max_bytes < 0) then
        raise("k.static: max_bytes must be a number of bytes")
    end
    -- at load time (no request is served yet): resolve dir once, as every check compares to it
    local root = ffi_ok and realpath_now(dir)
    if not root then raise("k.static: '" .. dir .. "' does not exist (or cannot be resolved)") end
    local cache = nil
    if opts.cache ~= false then
        if opts.cache ~= nil and opts.cache ~= true and type(opts.cache) ~= "table" then
            raise("k.static: cache must be false, true or a table {valid=, entries=, file_bytes=, "
                .. "total_bytes=}")
        end
        local given = type(opts.cache) == "table" and opts.cache or {}
        cache = {}
        for key, def in pairs(CACHE_DEFAULTS) do cache[key] = def end
        for key, v in pairs(given) do
            if CACHE_DEFAULTS[key] == nil then
                raise("k.static: unknown cache option '" .. tostring(key) .. "'")
            end
            if type(v) ~= "number" or v < 0 or (key == "entries" and (v < 1 or v % 1 ~= 0)) then
                raise("k.static: cache." .. key .. " must be a " .. (key == "entries"
                    and "positive integer" or "number >= 0"))
            end
            cache[key] = v
        end
    end
    local st = { root = root, index = opts.index or nil, follow = opts.follow_symlinks == true,
        dotfiles = opts.dotfiles == true, precompressed = opts.precompressed ~= false,
        cache_control = opts.cache_control, cache = cache, meta = {}, count = 0, total = 0,
        small = cache and cache.file_bytes or 65536 }
    local pattern = (prefix == "/" and "" or prefix:gsub("/+$", "")) .. "/*path"
    k.get(pattern, function(req, res) return serve(st, req, res) end)
end

return M
