-- khamsin.cookies: req.cookies (parsing the Cookie header) and res:set_cookie (one Set-Cookie
-- header per call), RFC 6265.
-- Parsing is tolerant of what browsers send: pairs split on ';', spaces and tabs around them
-- trimmed, a value in double quotes unquoted, a pair without '=' or with an empty name skipped,
-- bytes taken as they are (no percent-decoding: a value comes back as it was set). A name sent
-- twice (two cookies of the same name for different paths or domains): the first wins, as
-- browsers send the most specific first (RFC 6265 §5.4).
-- set_cookie refuses what a browser would drop or mangle, at the caller's line: a name that is
-- not a token, a value outside cookie-octet (no space, '"', ',', ';', '\', control bytes: encode
-- it first, e.g. base64url or k.json then percent-encoding), an attribute with ';' or a control
-- byte, an unknown option, SameSite=None without secure.
local errors = require "khamsin.errors"
errors.own()

local type, tostring, pairs, rawget, floor = type, tostring, pairs, rawget, math.floor
local find, sub, gsub, lower, format, date = string.find, string.sub, string.gsub, string.lower,
    string.format, os.date
local concat = table.concat
local raise = errors.raise

local M = {}

-- "a=1; b=\"2\"; a=3" -> { a = "1", b = "2" }
function M.parse(header)
    local out = {}
    if type(header) ~= "string" then return out end
    local pos, n = 1, #header
    while pos <= n do
        local semi = find(header, ";", pos, true) or n + 1
        local pair = sub(header, pos, semi - 1)
        pos = semi + 1
        local eq = find(pair, "=", 1, true)
        if eq then
            local name = gsub(sub(pair, 1, eq - 1), "^[ \t]*(.-)[ \t]*$", "%1")
            local value = gsub(sub(pair, eq + 1), "^[ \t]*(.-)[ \t]*$", "%1")
            if #value >= 2 and sub(value, 1, 1) == '"' and sub(value, -1) == '"' then
                value = sub(value, 2, -2)
            end
            if name ~= "" and out[name] == nil then out[name] = value end
        end
    end
    return out
end

local TOKEN = "^[!#$%%&'*+%-.^_`|~0-9A-Za-z]+$"
-- cookie-octet: %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E
local OCTETS = "^[]-~!#-+--:<-[]*$"
local SAMESITE = { strict = "Strict", lax = "Lax", none = "None" }
local OPTIONS = { path = 1, domain = 1, max_age = 1, expires = 1, secure = 1, http_only = 1,
    same_site = 1 }

local function show(v)
    if type(v) == "string" then
        if #v > 40 then v = sub(v, 1, 40) .. "..." end
        return format("%q", v)
    end
    return "a " .. type(v)
end

local function attr(what, v)
    if type(v) ~= "string" or v == "" or find(v, "[%z\1-\31\127;]") then
        raise("res:set_cookie(name, value, opts): " .. what .. " must be a non-empty string "
            .. "without ';' or control bytes, got " .. show(v))
    end
    return v
end

-- The Set-Cookie value for name, value, opts.
function M.format(name, value, opts)
    if type(name) ~= "string" or not find(name, TOKEN) then
        raise("res:set_cookie(name, value, opts): the name must be a token (letters, digits and "
            .. "!#$%&'*+-.^_`|~), got " .. show(name))
    end
    if type(value) == "number" then value = tostring(value) end
    if type(value) ~= "string" or not find(value, OCTETS) then
        raise("res:set_cookie(name, value, opts): the value may hold printable ASCII but for "
            .. "space, '\"', ',', ';' and '\\' (RFC 6265 cookie-octet): encode it first (e.g. "
            .. "base64url); got " .. show(value))
    end
    local parts = { name .. "=" .. value }
    if opts == nil then return parts[1] end
    if type(opts) ~= "table" then
        raise("res:set_cookie(name, value, opts): opts must be a table, got " .. show(opts))
    end
    for key in pairs(opts) do
        if not OPTIONS[key] then
            raise("res:set_cookie(name, value, opts): unknown option " .. show(key) .. " (the "
                .. "options are path, domain, max_age, expires, secure, http_only, same_site)")
        end
    end
    if opts.path ~= nil then parts[#parts + 1] = "Path=" .. attr("path", opts.path) end
    if opts.domain ~= nil then parts[#parts + 1] = "Domain=" .. attr("domain", opts.domain) end
    local ma = opts.max_age
    if ma ~= nil then
        if type(ma) ~= "number" or ma ~= floor(ma) or ma ~= ma or ma > 1e15 or ma < -1e15 then
            raise("res:set_cookie(name, value, opts): max_age must be an integer (seconds; 0 or "
                .. "less deletes the cookie), got " .. show(ma))
        end
        parts[#parts + 1] = format("Max-Age=%d", ma)
    end
    local ex = opts.expires
    if ex ~= nil then
        if type(ex) == "number" and ex == ex and ex >= 0 and ex < 253402300800 then
            parts[#parts + 1] = "Expires=" .. date("!%a, %d %b %Y %H:%M:%S GMT", floor(ex))
        else
            raise("res:set_cookie(name, value, opts): expires must be a time in seconds since "
                .. "the epoch (os.time()), got " .. show(ex))
        end
    end
    if opts.secure then parts[#parts + 1] = "Secure" end
    if opts.http_only then parts[#parts + 1] = "HttpOnly" end
    local ss = opts.same_site
    if ss ~= nil then
        local v = type(ss) == "string" and SAMESITE[lower(ss)]
        if not v then
            raise("res:set_cookie(name, value, opts): same_site must be \"Strict\", \"Lax\" or "
                .. "\"None\", got " .. show(ss))
        end
        if v == "None" and not opts.secure then
            raise("res:set_cookie(name, value, opts): same_site = \"None\" needs secure = true "
                .. "(browsers drop such a cookie otherwise)")
        end
        parts[#parts + 1] = "SameSite=" .. v
    end
    return concat(parts, "; ")
end

-- Adds one Set-Cookie to res.headers (a list when there are several; an existing Set-Cookie
-- key in any case is kept and extended).
function M.add(res, line)
    local h = res.headers
    if type(h) ~= "table" then raise("res.headers is " .. show(h) .. ": headers are a table") end
    local key = "Set-Cookie"
    for k in pairs(h) do
        if type(k) == "string" and lower(k) == "set-cookie" then key = k break end
    end
    local cur = rawget(h, key)
    if cur == nil or cur == false then
        h[key] = { line }
    elseif type(cur) == "table" then
        cur[#cur + 1] = line
    else
        h[key] = { cur, line }
    end
end

return M
