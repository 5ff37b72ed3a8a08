-- The --dev error page (issue 11, item 4): a Lua error answers 500 with the message, the
-- traceback and the source lines around the error, as HTML (escaped) for a browser, JSON for
-- application/json, plain text otherwise; never without --dev. An API misuse names the app's
-- file:line in both modes.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
local up = 1

local function helper(x)
    -- a comment with <b>markup</b> & "quotes"
    error("boom <script>alert(1)</script> " .. x) -- @boom
end

k.get("/boom", function() helper("deep") end)
k.get("/upvalue", function() return k.blocking(function() return up end) end) -- @upvalue
k.get("/index", function() local t = nil; return t.field end) -- @index
k.get("/ok", function() return "ok" end)
]]

local function line(name)
    local n = 0
    for l in (APP .. "\n"):gmatch("([^\n]*)\n") do
        n = n + 1
        if l:find("-- @" .. name, 1, true) then return n end
    end
    error("no line tagged " .. name)
end

local function fetch(srv, path, accept)
    local r
    srv:capture_errors(function()
        r = srv:request { path = path, headers = accept and { ["Accept"] = accept } or nil }
    end)
    return r
end

describe("--dev error page", function()
    local srv
    setup(function() srv = server.start { app = APP, dev = true, tls = false } end)
    teardown(function() if srv then srv:stop() end end)

    it("is HTML, escaped, with the source lines around the error, for a browser", function()
        local r = fetch(srv, "/boom", "text/html,application/xhtml+xml,*/*;q=0.8")
        assert.are.equal(500, r.status)
        assert.truthy(r.headers["content-type"]:match("^text/html"), r.headers["content-type"])
        assert.truthy(r.body:find("<!DOCTYPE html>", 1, true))
        -- the message, escaped: no live <script>
        assert.truthy(r.body:find("boom &lt;script&gt;alert(1)&lt;/script&gt; deep", 1, true), r.body)
        assert.falsy(r.body:find("<script>", 1, true), r.body)
        -- the source: the error's line marked, its neighbours shown, escaped
        local here = line("boom")
        assert.truthy(r.body:find(srv.app_path .. ":" .. here, 1, true), r.body)
        assert.truthy(r.body:find('<span class="here">%s*' .. here .. " | "), r.body)
        assert.truthy(r.body:find("&lt;b&gt;markup&lt;/b&gt; &amp; &quot;quotes&quot;", 1, true), r.body)
        assert.truthy(r.body:find(("%5d | local function helper"):format(here - 2), 1, true), r.body)
        -- the traceback, through the handler
        assert.truthy(r.body:find("stack traceback:", 1, true), r.body)
        assert.truthy(r.body:find("in function 'helper'", 1, true) or r.body:find("helper", 1, true), r.body)
    end)

    it("is JSON for application/json", function()
        local r = fetch(srv, "/boom", "application/json")
        assert.are.equal(500, r.status)
        assert.truthy(r.headers["content-type"]:match("^application/json"), r.headers["content-type"])
        local j = cjson.decode(r.body)
        assert.are.equal(srv.app_path, j.file)
        assert.are.equal(line("boom"), j.line)
        assert.truthy(j.message:find("boom <script>alert(1)</script> deep", 1, true), j.message)
        assert.truthy(j.traceback:find("stack traceback:", 1, true))
        local marked
        for _, l in ipairs(j.source) do
            if l.error then marked = l end
        end
        assert.are.equal(line("boom"), marked.line)
        assert.truthy(marked.text:find('error("boom', 1, true))
        assert.truthy(#j.source >= 6, #j.source)
    end)

    it("is plain text otherwise, with a marked source line", function()
        for _, accept in ipairs { false, "*/*", "text/plain" } do
            local r = fetch(srv, "/index", accept or nil)
            assert.are.equal(500, r.status)
            assert.truthy(r.headers["content-type"]:match("^text/plain"), r.headers["content-type"])
            assert.truthy(r.body:find("attempt to index", 1, true), r.body)
            assert.truthy(r.body:find((">%5d | "):format(line("index")), 1, true), r.body)
            assert.truthy(r.body:find("stack traceback:", 1, true), r.body)
        end
    end)

    it("names the app's line for an API misuse", function()
        local r = fetch(srv, "/upvalue", "application/json")
        local j = cjson.decode(r.body)
        assert.truthy(j.message:find(srv.app_path .. ":" .. line("upvalue") .. ":", 1, true), j.message)
        assert.truthy(j.message:find("upvalue", 1, true), j.message)
        assert.are.equal(line("upvalue"), j.line)
    end)
end)

describe("without --dev", function()
    local srv
    setup(function() srv = server.start { app = APP, tls = false } end)
    teardown(function() if srv then srv:stop() end end)

    it("never sends the page, the message or the source", function()
        for _, accept in ipairs { "text/html", "application/json", "*/*" } do
            local r
            local log = srv:capture_errors(function()
                r = srv:request { path = "/boom", headers = { ["Accept"] = accept } }
            end)
            assert.are.equal(500, r.status)
            assert.are.equal("Internal Server Error\n", r.body)
            assert.truthy(r.headers["content-type"]:match("^text/plain"))
            -- the log has it all
            assert.truthy(log:find("boom <script>", 1, true), log)
            assert.truthy(log:find("stack traceback:", 1, true), log)
        end
    end)

    it("names the app's line for an API misuse (in the log)", function()
        local r
        local log = srv:capture_errors(function() r = srv:request { path = "/upvalue" } end)
        assert.are.equal(500, r.status)
        assert.truthy(log:find(srv.app_path .. ":" .. line("upvalue") .. ":", 1, true), log)
    end)
end)
