-- khamsin.shared: dictionaries shared by every worker (core/kh_shdict.c), like OpenResty's
-- ngx.shared.DICT. Declare one while the script loads: k.shared_dict("cache", 1024 * 1024);
-- every worker runs the same script and gets the same dict. k.shared("cache") returns it.
-- Values: strings, numbers, booleans (nil deletes). Keys: strings. Each entry may have a ttl
-- (seconds, on set/add/replace and incr's init; changed by expire, read by ttl); an expired
-- entry reads as absent and is reclaimed lazily. get_keys(max) lists keys. The memory is fixed (an arena
-- of `bytes`); when it is full, set/add/incr evict expired entries, then the least recently used
-- ones; an entry larger than the largest block (power of two <= bytes) is nil, "no memory".
-- Wrong arguments are refused here, in Lua, with messages that name the app's line
-- (errors.raise) and count arguments as the app wrote them (d:set(key, value, ttl)).
local core = require "khamsin.core"
local errors = require "khamsin.errors"
errors.own()

local setmetatable, getmetatable, type, tostring = setmetatable, getmetatable, type, tostring
local raise = errors.raise
local get, set, incr, delete = core.shdict_get, core.shdict_set, core.shdict_incr, core.shdict_delete
local SET, ADD, REPLACE = 0, 1, 2 -- kh_shdict_set's modes

local M = {}
local dicts = {}

local Dict = {}
Dict.__index = Dict

local function check(self, what, key)
    if getmetatable(self) ~= Dict then
        raise("dict:" .. what .. "() is a method: call it with a colon")
    end
    local t = type(key)
    if t ~= "string" and t ~= "number" then
        raise("dict:" .. what .. "(key, ...): key must be a string, got a " .. t)
    end
end

local function check_value(what, value)
    local t = type(value)
    if t ~= "string" and t ~= "number" and t ~= "boolean" and t ~= "nil" then
        raise("dict:" .. what .. "(key, value, ttl): values are strings, numbers, booleans or "
            .. "nil, got a " .. t)
    end
end

local function check_ttl(what, ttl)
    if ttl ~= nil and (type(ttl) ~= "number" or not (ttl >= 0 and ttl <= 1e9)) then
        raise("dict:" .. what .. "(...): ttl must be seconds from 0 (none) to 1e9, got "
            .. (type(ttl) == "number" and tostring(ttl) or "a " .. type(ttl)))
    end
end

function Dict:get(key)
    check(self, "get", key)
    return get(self._d, key)
end
-- set, add and replace: the same checks, then one store with its mode
local function store(self, what, mode, key, value, ttl)
    check(self, what, key)
    check_value(what, value)
    check_ttl(what, ttl)
    return set(self._d, key, value, ttl, mode)
end
-- set(key, value, ttl_seconds?) -> true, nil, evicted | nil, "no memory"
function Dict:set(key, value, ttl) return store(self, "set", SET, key, value, ttl) end
-- add: only when absent -> true | false, "exists" | nil, "no memory"
function Dict:add(key, value, ttl) return store(self, "add", ADD, key, value, ttl) end
-- replace: only when present -> true | false, "not found" | nil, "no memory"
function Dict:replace(key, value, ttl) return store(self, "replace", REPLACE, key, value, ttl) end
-- ttl(key) -> seconds left (0: never expires) | nil, "not found"
function Dict:ttl(key)
    check(self, "ttl", key)
    return core.shdict_ttl(self._d, key)
end
-- expire(key, ttl) -> true | false, "not found"; ttl 0 (or nil): never expires
function Dict:expire(key, ttl)
    check(self, "expire", key)
    check_ttl("expire", ttl)
    return core.shdict_expire(self._d, key, ttl)
end
-- get_keys(max = 1024) -> { key, ... }, most recently used first; 0: all (the dict's lock is
-- held while they are copied: bound it on a big dict)
function Dict:get_keys(max)
    if getmetatable(self) ~= Dict then raise("dict:get_keys() is a method: call it with a colon") end
    if max ~= nil and (type(max) ~= "number" or not (max >= 0 and max <= 1e9) or max % 1 ~= 0) then
        raise("dict:get_keys(max): max must be an integer from 0 (all) to 1e9, got "
            .. (type(max) == "number" and tostring(max) or "a " .. type(max)))
    end
    return core.shdict_keys(self._d, max or 1024)
end
-- incr(key, by = 1, init?, ttl?) -> new value | nil, "not found" | "not a number"
function Dict:incr(key, by, init, ttl)
    check(self, "incr", key)
    if by ~= nil and type(by) ~= "number" then
        raise("dict:incr(key, by, init, ttl): by must be a number, got a " .. type(by))
    end
    if init ~= nil and type(init) ~= "number" then
        raise("dict:incr(key, by, init, ttl): init must be a number, got a " .. type(init))
    end
    check_ttl("incr", ttl)
    return incr(self._d, key, by or 1, init, ttl)
end
function Dict:delete(key)
    check(self, "delete", key)
    return delete(self._d, key)
end
function Dict:flush_all()
    if getmetatable(self) ~= Dict then raise("dict:flush_all() is a method: call it with a colon") end
    core.shdict_flush(self._d)
end
-- count, bytes used, capacity
function Dict:stats()
    if getmetatable(self) ~= Dict then raise("dict:stats() is a method: call it with a colon") end
    return core.shdict_stats(self._d)
end

local function wrap(name, d)
    local o = dicts[name]
    if not o then
        o = setmetatable({ name = name, _d = d }, Dict)
        dicts[name] = o
    end
    return o
end

function M.declare(name, bytes)
    if not core.loading() then
        raise("k.shared_dict: dictionaries are declared while the script loads (every worker "
            .. "declares the same ones); use k.shared(name) to reach one from a handler")
    end
    if type(name) ~= "string" then
        raise("k.shared_dict(name, bytes): name must be a string, got a " .. type(name))
    end
    if type(bytes) ~= "number" or not (bytes >= 4096 and bytes <= 1099511627776) then
        raise("k.shared_dict(name, bytes): bytes must be a number from 4096 to 1 TiB, got "
            .. (type(bytes) == "number" and tostring(bytes) or "a " .. type(bytes)))
    end
    local d, err = core.shdict_declare(name, bytes)
    if not d then -- declared before with another size
        if core.gen() > 1 then -- a reload (the instance being built is not the first)
            err = err .. "; a reload cannot resize a dictionary (its memory belongs to the "
                .. "process and keeps its contents): restart khamsin to change the size"
        end
        raise("k.shared_dict: " .. err)
    end
    return wrap(name, d)
end

function M.get(name)
    local o = dicts[name]
    if o then return o end
    local d = core.shdict_find(name)
    if not d then
        raise("k.shared: no dict named '" .. tostring(name) .. "' (declare it with "
            .. "k.shared_dict(name, bytes) while the script loads)")
    end
    return wrap(name, d)
end

return M
