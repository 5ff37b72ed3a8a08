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
-- Accept-Encoding (with Vary). NOT streamed yet: the bytes sent (the file or the range) are read
-- into memory, at most opts.max_bytes (default 16 MiB, then 500 with a log line); streaming with
-- backpressure waits for the streaming-reply seam (res:write + drain).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()
local raise = errors.raise

local type, tonumber, tostring, find, sub, lower, format, floor, concat =
    type, tonumber, tostring, string.find, string.sub, string.lower, string.format, math.floor,
    table.concat
local fs_stat, fs_realpath, fs_read = core.fs_stat, core.fs_realpath, core.fs_read

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

local function serve(st, req, res)
    local rel = req.params.path or ""
    if sub(rel, -1) == "/" then rel = sub(rel, 1, -2) end -- "dir/" asks for its index
    if not check_segments(rel, st.dotfiles) then return not_found() end
    local path = rel == "" and st.root or (st.root .. "/" .. rel)
    local ok, real = fs_realpath(path)
    if not ok then return not_found() end
    if not st.follow and not inside(st.root, real) then return not_found() end
    local size, mtime, kind
    ok, size, mtime, kind = fs_stat(real)
    if not ok then return not_found() end
    if kind == "dir" then
        if not st.index then return not_found() end
        real = real .. "/" .. st.index
        ok, size, mtime, kind = fs_stat(real)
        if not ok then return not_found() end
    end
    if kind ~= "file" then return not_found() end
    local headers = { ["Content-Type"] = content_type(real), ["Accept-Ranges"] = "bytes",
        ["Cache-Control"] = st.cache_control }
    local file, enc = real, nil
    if st.precompressed then
        headers["Vary"] = "Accept-Encoding"
        local acc = accepted(req.headers["accept-encoding"])
        for _, s in ipairs(SIBLINGS) do
            if acc[s[1]] then
                local cand = real .. s[2]
                local ok2, creal = fs_realpath(cand)
                if ok2 and (st.follow or inside(st.root, creal)) then
                    local ok3, csize, cmtime, ckind = fs_stat(creal)
                    if ok3 and ckind == "file" then
                        file, enc, size, mtime = creal, s[1], csize, cmtime
                        headers["Content-Encoding"] = enc
                        break
                    end
                end
            end
        end
    end
    local etag = format('"%x-%x%s"', size, mtime, enc and ("-" .. enc) or "")
    headers["ETag"] = etag
    headers["Last-Modified"] = http_date(mtime)
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
    if n > st.max_bytes then
        core.log(0, "k.static: " .. file .. " is " .. n .. " bytes, above max_bytes (" .. st.max_bytes
            .. "): static replies are not streamed yet")
        return 500, "Internal Server Error\n"
    end
    local data = ""
    if n > 0 and req.method ~= "HEAD" then
        local okr, bytes = fs_read(file, first, n)
        if not okr then return not_found() end
        if #bytes ~= n then return 500, "Internal Server Error\n" end -- the file shrank
        data = bytes
    elseif req.method == "HEAD" then
        -- the engine sends HEAD's head only; Content-Length must still be the GET's
        local okr, bytes = fs_read(file, first, n)
        if not okr then return not_found() end
        data = bytes
    end
    return status, data, headers
end

local OPTS = { index = 1, follow_symlinks = 1, dotfiles = 1, precompressed = 1, max_bytes = 1,
    cache_control = 1 }

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
    local st = { root = root, index = opts.index or nil, follow = opts.follow_symlinks == true,
        dotfiles = opts.dotfiles == true, precompressed = opts.precompressed ~= false,
        max_bytes = opts.max_bytes or 16777216, cache_control = opts.cache_control }
    local pattern = (prefix == "/" and "" or prefix:gsub("/+$", "")) .. "/*path"
    k.get(pattern, function(req, res) return serve(st, req, res) end)
end

return M
