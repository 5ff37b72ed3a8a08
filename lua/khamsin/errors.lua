-- khamsin.errors: the kinds of error a handler can raise that are not bugs.
--  * http errors (k.fail(status, message), req:json() on bad JSON): answered with that status;
--  * aborts: the request is over (the client left, or the engine already answered 413 / 408);
--    every wait raises one so the handler's pcall cleanups run, and nothing is logged as [error];
--  * busy: k.blocking found the pool queue full; uncaught, it answers 503 with Retry-After.
local setmetatable, getmetatable, type, tostring = setmetatable, getmetatable, type, tostring

local M = {}

local http_mt = { __tostring = function(e) return e.status .. " " .. tostring(e.message) end }
local aborted_mt = { __tostring = function(e) return "khamsin.aborted: " .. tostring(e.reason) end }
local busy_mt = { __tostring = function(e) return "khamsin.busy: " .. tostring(e.reason) end }

function M.http(status, message)
    return setmetatable({ status = status, message = message }, http_mt)
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
