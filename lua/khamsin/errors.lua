-- khamsin.errors: the kinds of error a handler can raise that are not bugs.
--  * http errors (k.fail(status, message), req:json() on bad JSON): answered with that status;
--  * aborts: the request is over (the client left, or the engine already answered 413 / 408);
--    every wait raises one so the handler's pcall cleanups run, and nothing is logged as [error];
--  * busy: k.blocking found the pool queue full; uncaught, it answers 503 with Retry-After.
-- Also: M.raise(msg), the error for a misuse of the API, which names the app's file:line (the
-- first frame on the stack that is not one of khamsin's own modules), however deep inside
-- khamsin it is found and whatever tail calls removed from the stack.
local setmetatable, getmetatable, type, tostring, error = setmetatable, getmetatable, type,
    tostring, error
local getinfo, getlocal = debug.getinfo, debug.getlocal

local M = {}

-- The chunk names of khamsin's own modules ("@khamsin/request.lua" when built in): frames of
-- these are skipped when an error names the app's line. Each module calls M.own() as it loads.
local ours = {}
function M.own()
    ours[getinfo(2, "S").source] = true
end
M.own()

-- Whether a chunk name (debug.getinfo's source) is one of khamsin's own modules.
function M.is_ours(source)
    return ours[source] == true
end

-- The function that calls a request's handler, handler as its first argument (khamsin.lua's
-- `serve`). When the app's own frames are gone from the stack (a handler that ends in
-- `return k.blocking(...)` is a tail call; the handler already returned its values), the
-- error names the handler's definition instead.
local runner
function M.set_runner(fn) runner = fn end

-- "file:line: " of the app's code that called into khamsin, or "" when there is none.
function M.where()
    for level = 2, 60 do
        local info = getinfo(level, "Slf")
        if not info then break end
        if info.func == runner then
            local _, h = getlocal(level, 1)
            if type(h) == "function" then
                local d = getinfo(h, "S")
                return d.short_src .. ":" .. d.linedefined .. ": in the handler defined here: "
            end
        elseif info.what ~= "C" and not ours[info.source] and info.currentline > 0 then
            return info.short_src .. ":" .. info.currentline .. ": "
        end
    end
    return ""
end

-- Raises msg as a bug of the app's (a 500, logged with the traceback), at the app's line.
function M.raise(msg)
    error(M.where() .. msg, 0)
end

local http_mt = { __tostring = function(e) return e.status .. " " .. tostring(e.message) end }
local aborted_mt = { __tostring = function(e) return "khamsin.aborted: " .. tostring(e.reason) end }
local busy_mt = { __tostring = function(e) return "khamsin.busy: " .. tostring(e.reason) end }

function M.http(status, message)
    return setmetatable({ status = status, message = message }, http_mt)
end

-- A failed precondition (RFC 9110 §13.1): 412, raised by res:etag / res:last_modified.
function M.fail412(why)
    error(M.http(412, "Precondition Failed: " .. why), 0)
end

function M.is_http(e)
    return type(e) == "table" and getmetatable(e) == http_mt
end

function M.aborted(reason)
    return setmetatable({ reason = reason or "closed" }, aborted_mt)
end

function M.is_aborted(e)
    return type(e) == "table" and getmetatable(e) == aborted_mt
end

function M.busy(reason)
    return setmetatable({ reason = reason or "busy" }, busy_mt)
end

function M.is_busy(e)
    return type(e) == "table" and getmetatable(e) == busy_mt
end

return M
