-- khamsin.cors: k.cors{...}, a ready middleware for CORS (the Fetch standard's CORS protocol).
-- Owns: the checking of the options (at load time) and the headers of each reply.
-- A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here with 204
-- and never reaches a handler, on any path: no k.options("/*any") route is needed, so unknown
-- paths stay 404 and known ones keep their own Allow on 405. Other requests get
-- Access-Control-Allow-Origin (and -Credentials, -Expose-Headers) before next(), so the reply
-- carries them whatever answers: the handler, k.fail, a 500, or the engine's 404/405.
-- Rules kept: the allowed origin is echoed (never "*") when credentials are on, and
-- origins = "*" with credentials = true is refused at load time (any site could then read
-- credentialed replies); Vary: Origin whenever the answer depends on the Origin.
local errors = require "khamsin.errors"
local response = require "khamsin.response"
errors.own()

local type, pairs, concat, lower, tostring = type, pairs, table.concat, string.lower, tostring
local raise, describe = errors.raise, response.describe

local M = {}

local DEFAULT_METHODS = "GET, HEAD, PUT, PATCH, POST, DELETE"

-- a list of tokens ("GET" or {"GET", "POST"}) -> "GET, POST"
local function token_list(what, v)
    if type(v) == "string" then v = { v } end
    if type(v) ~= "table" then raise(what .. " must be a string or a list of strings, got " .. describe(v)) end
    for i = 1, #v do
        if type(v[i]) ~= "string" or not v[i]:match("^[!#$%%&'*+%-.^_`|~%w]+$") then
            raise(what .. ": item " .. i .. " is not a token, got " .. describe(v[i]))
        end
    end
    return concat(v, ", ")
end

-- Adds a value to the reply's Vary (whatever case the app used for the name).
local function add_vary(h, value)
    for k, v in pairs(h) do
        if type(k) == "string" and lower(k) == "vary" then
            if type(v) == "table" then -- a list: one more field
                v[#v + 1] = value
                return
            end
            local cur = tostring(v)
            if not lower(cur):find(lower(value), 1, true) then h[k] = cur .. ", " .. value end
            return
        end
    end
    h["Vary"] = value
end
M.add_vary = add_vary

function M.new(opts)
    if type(opts) ~= "table" then
        raise("k.cors{origins = ..., ...}: the options are a table, got " .. describe(opts))
    end
    for key in pairs(opts) do
        if key ~= "origins" and key ~= "methods" and key ~= "headers" and key ~= "expose"
                and key ~= "credentials" and key ~= "max_age" then
            raise("k.cors: unknown option '" .. tostring(key) .. "' (origins, methods, headers, "
                .. "expose, credentials, max_age)")
        end
    end
    local origins = opts.origins
    local any, allow_fn, set = false, nil, nil
    if origins == "*" then
        any = true
    elseif type(origins) == "function" then
        allow_fn = origins
    elseif type(origins) == "table" then
        set = {}
        for i = 1, #origins do
            local o = origins[i]
            if type(o) ~= "string" or not o:match("^[%w+.-]+://[^%s/]+$") and o ~= "null" then
                raise("k.cors: origins[" .. i .. "] is not an origin like "
                    .. "\"https://app.example\" (scheme://host[:port], no path), got " .. describe(o))
            end
            set[lower(o)] = true
        end
    else
        raise("k.cors: origins must be \"*\", a list of origins or a function(origin, req), got "
            .. describe(origins))
    end
    local credentials = opts.credentials
    if credentials ~= nil and type(credentials) ~= "boolean" then
        raise("k.cors: credentials must be a boolean, got " .. describe(credentials))
    end
    if credentials and any then
        raise("k.cors: credentials = true with origins = \"*\" would let every site read "
            .. "credentialed replies (and browsers refuse \"*\" with credentials): list the "
            .. "origins or give a function")
    end
    local methods = opts.methods and token_list("k.cors: methods", opts.methods) or DEFAULT_METHODS
    local headers = opts.headers and token_list("k.cors: headers", opts.headers)
    local expose = opts.expose and token_list("k.cors: expose", opts.expose)
    local max_age = opts.max_age
    if max_age ~= nil then
        if type(max_age) ~= "number" or max_age % 1 ~= 0 or max_age < 0 then
            raise("k.cors: max_age must be a whole number of seconds, got " .. describe(max_age))
        end
        max_age = tostring(max_age)
    end

    -- the Access-Control-Allow-Origin value for this origin, or nil when it is not allowed
    local function allowed(origin, req)
        if any then return "*" end
        if set then return set[lower(origin)] and origin or nil end
        return allow_fn(origin, req) and origin or nil
    end

    return function(req, res, next)
        local h = res.headers
        if not any then add_vary(h, "Origin") end
        local origin = req.headers.origin
        if origin == nil then return next() end
        local acao = allowed(origin, req)
        if req.method == "OPTIONS" and req.headers["access-control-request-method"] then
            -- the preflight: answered here (RFC-less, Fetch §3.2.5), never by a handler
            if acao then
                h["Access-Control-Allow-Origin"] = acao
                if credentials then h["Access-Control-Allow-Credentials"] = "true" end
                h["Access-Control-Allow-Methods"] = methods
                if headers then
                    h["Access-Control-Allow-Headers"] = headers
                else
                    local want = req.headers["access-control-request-headers"]
                    if want then h["Access-Control-Allow-Headers"] = want end
                    add_vary(h, "Access-Control-Request-Headers")
                end
                if max_age then h["Access-Control-Max-Age"] = max_age end
            end
            return 204
        end
        if acao then
            h["Access-Control-Allow-Origin"] = acao
            if credentials then h["Access-Control-Allow-Credentials"] = "true" end
            if expose then h["Access-Control-Expose-Headers"] = expose end
        end
        return next()
    end
end

return M
