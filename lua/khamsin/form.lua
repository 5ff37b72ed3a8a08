-- khamsin.form: req:form(), an application/x-www-form-urlencoded body (the WHATWG URL
-- standard's parser, as browsers send it) as a table.
-- Choices: a name sent once is a string, a name repeated is an array of its values in order
-- (as req.args); "+" is a space; "%XX" is decoded (a '%' without two hex digits is refused, not
-- passed through: a 400 names it); a pair without "=" is the name with the value ""; empty
-- pairs ("a=1&&b=2") are skipped. More than opts.max_fields pairs (limit form_fields) is a 400.
-- Loaded on the first req:form().
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()

local type, tonumber, char, gsub, find, sub, lower, error =
    type, tonumber, string.char, string.gsub, string.find, string.sub, string.lower, error

local M = {}

local function bad(reason) error(errors.http(400, reason), 0) end

local function hexchar(h) return char(tonumber(h, 16)) end

local function decode(s)
    if find(s, "+", 1, true) then s = gsub(s, "+", " ") end
    if not find(s, "%", 1, true) then return s end
    -- every '%' must start an escape: "%zz" or a trailing '%' is malformed
    if find(s, "%%%X") or find(s, "%%%x%X") or find(s, "%%%x?$") then
        bad("invalid form body: a '%' is not followed by two hex digits")
    end
    return (gsub(s, "%%(%x%x)", hexchar))
end
M.decode = decode

-- body -> table; max_fields bounds the pairs
function M.parse(body, max_fields)
    local out, n, pos, len = {}, 0, 1, #body
    while pos <= len do
        local amp = find(body, "&", pos, true) or len + 1
        if amp > pos then
            n = n + 1
            if n > max_fields then
                bad("invalid form body: more than " .. max_fields .. " fields")
            end
            local pair = sub(body, pos, amp - 1)
            local eq = find(pair, "=", 1, true)
            local key, val
            if eq then
                key, val = decode(sub(pair, 1, eq - 1)), decode(sub(pair, eq + 1))
            else
                key, val = decode(pair), ""
            end
            local prev = out[key]
            if prev == nil then
                out[key] = val
            elseif type(prev) == "table" then
                prev[#prev + 1] = val
            else
                out[key] = { prev, val }
            end
        end
        pos = amp + 1
    end
    return out
end

-- req:form(opts): the body must be sent as application/x-www-form-urlencoded (else 415)
function M.read(req, opts)
    local max = opts and opts.max_fields or core.limit("form_fields")
    local ct = req.headers["content-type"]
    local mt = ct and lower((ct:match("^%s*([^;%s]+)")) or "")
    if mt ~= "application/x-www-form-urlencoded" then
        error(errors.http(415, "req:form() expects an application/x-www-form-urlencoded body, "
            .. "got " .. (ct and ("Content-Type " .. ct) or "no Content-Type")), 0)
    end
    return M.parse(req:body(), max)
end

return M
