-- khamsin.coroutine: lets the app's own coroutines wait (style.md §4 "User coroutines").
-- An engine wait (req:body(), k.sleep, k.blocking) yields the sentinel core.YIELD from whatever
-- coroutine it runs in. When that is a coroutine the app made, the replaced coroutine.resume /
-- coroutine.wrap yield the sentinel upward, to the engine, and resume the inner coroutine with
-- what the engine sends back, so the app never sees it (lua-nginx-module's co_op, in Lua).
-- Installed once per worker state before the app loads; it changes the global `coroutine`.
local core = require "khamsin.core"
require("khamsin.errors").own() -- its frames are skipped when an error names the app's line

local YIELD = core.YIELD
local create, resume, yield, status, running =
    coroutine.create, coroutine.resume, coroutine.yield, coroutine.status, coroutine.running
local select, error = select, error

if coroutine._khamsin then return coroutine end

-- ok, values... from resume(co, ...): pass engine waits up until co yields for real or ends
local function pass(co, ok, ...)
    if ok and select("#", ...) == 1 and (...) == YIELD and status(co) == "suspended" then
        -- the engine parks the outer coroutine and resumes it with the wait's results
        return pass(co, resume(co, yield(YIELD)))
    end
    return ok, ...
end

function coroutine.resume(co, ...)
    return pass(co, resume(co, ...))
end

local function unwrap(ok, ...)
    if not ok then error((...), 0) end
    return ...
end

function coroutine.wrap(fn)
    local co = create(fn)
    return function(...)
        return unwrap(pass(co, resume(co, ...)))
    end
end

-- true inside a coroutine the engine runs (or one of the app's, nested in it)
coroutine.running = running
coroutine._khamsin = true

return coroutine
