-- khamsin.devpage: the --dev error page. A handler's Lua error answers 500 with the message,
-- the traceback and the source lines around the error: HTML (escaped) when Accept names
-- text/html, JSON when it names application/json, plain text otherwise. Only in --dev: in
-- production the body says "Internal Server Error" and nothing more (response.fail).
-- Owns:  nothing; locate() runs in the runner's xpcall handler (the failed stack still there),
--        render() when the 500 is answered.
-- Reads: the app's source file, for the lines around the error (a small blocking read, on the
--        worker's thread: --dev only, one worker, a page a developer asked for).
local errors = require "khamsin.errors"
errors.own()

local getinfo = debug.getinfo
local type, tostring, tonumber, open, concat, format, max = type, tostring, tonumber, io.open,
    table.concat, string.format, math.max

local M = {}

local CONTEXT = 5 -- lines shown before and after the error's line

-- Where the error is: {file = full path, short = as the message names it, line = n}. The
-- message's own "file:line: " prefix (error(), errors.raise) is matched against the stack's
-- frames to get the full path (a message shortens a long one); without a prefix, the first
-- frame of the app's code.
function M.locate(msg, level)
    local short, line = tostring(msg):match("^(.-):(%d+): ")
    line = tonumber(line)
    local first
    for l = (level or 2) + 1, 80 do
        local info = getinfo(l, "Sl")
        if not info then break end
        local src = info.source
        if type(src) == "string" and src:sub(1, 1) == "@" and not errors.is_ours(src) then
            if short and info.short_src == short and info.currentline == line then
                return { file = src:sub(2), short = short, line = line }
            end
            if not first and info.currentline > 0 then
                first = { file = src:sub(2), short = info.short_src, line = info.currentline }
            end
        end
    end
    if short and short:sub(1, 3) ~= "..." and short:sub(1, 1) ~= "[" then
        return { file = short, short = short, line = line } -- not on the stack any more
    end
    return first
end

-- {{n = line number, text = line, here = true for the error's}} or nil
local function source_lines(where)
    if not where or not where.file or not where.line then return nil end
    local f = open(where.file, "r")
    if not f then return nil end
    local out, n = {}, 0
    local from, to = max(1, where.line - CONTEXT), where.line + CONTEXT
    for text in f:lines() do
        n = n + 1
        if n > to then break end
        if n >= from then out[#out + 1] = { n = n, text = text, here = n == where.line } end
    end
    f:close()
    return #out > 0 and out or nil
end

local function html_escape(s)
    return (tostring(s):gsub("[&<>\"']", {
        ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;",
    }))
end

local function text_page(msg, tb, where, lines)
    local out = { "Internal Server Error (khamsin --dev)", "", tostring(msg), "" }
    if lines then
        out[#out + 1] = format("%s:%d", where.file, where.line)
        for _, l in ipairs(lines) do
            out[#out + 1] = format("%s%5d | %s", l.here and ">" or " ", l.n, l.text)
        end
        out[#out + 1] = ""
    end
    out[#out + 1] = tb
    return concat(out, "\n") .. "\n"
end

local function html_page(msg, tb, where, lines)
    local out = {
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>500 Internal Server Error",
        "</title>\n<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;",
        "padding:1em;overflow:auto}.here{background:#fdd;font-weight:bold}</style></head>\n",
        "<body><h1>500 Internal Server Error</h1>\n<p>khamsin --dev: a Lua error in the handler",
        " (this page is never sent without --dev)</p>\n<h2 class=\"message\">", html_escape(msg),
        "</h2>\n",
    }
    if lines then
        out[#out + 1] = format("<h3>%s:%d</h3>\n<pre class=\"source\">", html_escape(where.file),
            where.line)
        for _, l in ipairs(lines) do
            local row = format("%5d | %s", l.n, html_escape(l.text))
            if l.here then row = "<span class=\"here\">" .. row .. "</span>" end
            out[#out + 1] = row .. "\n"
        end
        out[#out + 1] = "</pre>\n"
    end
    out[#out + 1] = "<h3>Traceback</h3>\n<pre class=\"traceback\">" .. html_escape(tb) .. "</pre>\n"
    out[#out + 1] = "</body></html>\n"
    return concat(out)
end

-- body, content type for a 500 in --dev. e: the runner's error ({traceback, message, where}).
function M.render(accept, e, json_encode)
    local tb = type(e) == "table" and e.traceback or tostring(e)
    local msg = type(e) == "table" and e.message or tb:match("^[^\n]*")
    local where = type(e) == "table" and e.where or nil
    local lines = source_lines(where)
    accept = type(accept) == "string" and accept:lower() or ""
    if accept:find("text/html", 1, true) then
        return html_page(msg, tb, where, lines), "text/html; charset=utf-8"
    end
    if accept:find("application/json", 1, true) and json_encode then
        local src
        if lines then
            src = {}
            for i, l in ipairs(lines) do src[i] = { line = l.n, text = l.text, error = l.here } end
        end
        local out = json_encode({
            error = "Internal Server Error", message = tostring(msg), traceback = tb,
            file = where and where.file or nil, line = where and where.line or nil, source = src,
        })
        if out then return out, "application/json" end
    end
    return text_page(msg, tb, where, lines), "text/plain; charset=utf-8"
end

return M
