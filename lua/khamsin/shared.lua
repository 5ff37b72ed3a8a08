-- khamsin.shared: dictionaries shared by every worker (core/kh_shdict.c), like OpenResty's
-- ngx.shared.DICT. Declare one while the script loads: k.shared_dict("cache", 1024 * 1024);
-- every worker runs the same script and gets the same dict. k.shared("cache") returns it.
-- Values: strings, numbers, booleans (nil deletes). Keys: strings. The memory is fixed (an arena
-- of `bytes`); when it is full, set/add/incr evict expired entries, then the least recently used
-- ones; an entry larger than the largest block (power of two <= bytes) is nil, "no memory".
local core = require "khamsin.core"

local setmetatable, error, type = setmetatable, error, type
local get, set, incr, delete = core.shdict_get, core.shdict_set, core.shdict_incr, core.shdict_delete

local M = {}
local dicts = {}

local Dict = {}
Dict.__index = Dict

function Dict:get(key) return get(self._d, key) end
-- set(key, value, ttl_seconds?) -> true, nil, evicted | nil, "no memory"
function Dict:set(key, value, ttl) return set(self._d, key, value, ttl, false) end
-- add: only when absent -> true | false, "exists" | nil, "no memory"
function Dict:add(key, value, ttl) return set(self._d, key, value, ttl, true) end
-- incr(key, by = 1, init?, ttl?) -> new value | nil, "not found" | "not a number"
function Dict:incr(key, by, init, ttl) return incr(self._d, key, by or 1, init, ttl) end
function Dict:delete(key) return delete(self._d, key) end
function Dict:flush_all() core.shdict_flush(self._d) end
-- count, bytes used, capacity
function Dict:stats() return core.shdict_stats(self._d) end

local function wrap(name, d)
    local o = dicts[name]
    if not o then
        o = setmetatable({ name = name, _d = d }, Dict)
        dicts[name] = o
    end
    return o
end

function M.declare(name, bytes)
    if type(name) ~= "string" then error("k.shared_dict(name, bytes): name must be a string", 2) end
    if type(bytes) ~= "number" then error("k.shared_dict(name, bytes): bytes must be a number", 2) end
    return wrap(name, core.shdict_declare(name, bytes))
end

function M.get(name)
    local o = dicts[name]
    if o then return o end
    local d = core.shdict_find(name)
    if not d then
        error("k.shared: no dict named '" .. tostring(name) .. "' (declare it with "
            .. "k.shared_dict(name, bytes) while the script loads)", 2)
    end
    return wrap(name, d)
end

return M
