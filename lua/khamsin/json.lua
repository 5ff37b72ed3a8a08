-- khamsin.json: k.json, the JSON codec (lua/kh_lua_json.c; the rules are in its header).
--   k.json.encode(value) -> string; a value that cannot be sent (a function, NaN, a sparse array,
--     a table nested deeper than 1000 levels) raises an error at the caller's line that names
--     the path of that value: "k.json.encode: a function cannot be sent as JSON, at $.items[3].f".
--   k.json.decode(s[, max_depth = 1000]) -> value | nil, message: invalid JSON is not a bug, so it is
--     returned, not raised: "expected a value at byte 12 ('x'), at $.items[3].name".
--   k.json.array(t) -> t, marked as an array ({} -> []); decoded arrays carry the same mark.
--   k.json.null: JSON's null (the same value as cjson.null).
-- Paths index as Lua does: $.items[1] is the first element.
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()

local type, tostring, getmetatable = type, tostring, getmetatable
local enc, dec, mark, is_array = core.json_encode, core.json_decode, core.json_array,
    core.json_is_array
local raise = errors.raise

local M = { null = core.json_null }

local function depth_arg(what, d)
    if d ~= nil and (type(d) ~= "number" or not (d >= 1 and d <= 1000)) then
        raise(what .. ": max_depth must be a number from 1 to 1000, got "
            .. (type(d) == "number" and tostring(d) or "a " .. type(d)))
    end
end

function M.encode(value)
    local s, msg, path = enc(value)
    if not s then raise("k.json.encode: " .. msg .. ", at " .. path) end
    return s
end

function M.decode(s, max_depth)
    if type(s) ~= "string" then
        raise("k.json.decode(s): s must be a string, got a " .. type(s))
    end
    depth_arg("k.json.decode(s, max_depth)", max_depth)
    local v, msg, path = dec(s, max_depth)
    if v == nil then return nil, msg .. ", at " .. path end
    return v
end

function M.array(t)
    if type(t) ~= "table" then
        raise("k.json.array(t): t must be a table, got a " .. type(t))
    end
    local r = mark(t)
    if not r then
        raise("k.json.array(t): the table already has a metatable (" .. tostring(getmetatable(t))
            .. "); the array mark is a metatable of its own")
    end
    return t
end

M.is_array = is_array

return M
