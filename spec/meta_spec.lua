-- spec/meta_spec.lua: library/khamsin.lua (the LuaLS annotations) covers the public API, and only
-- the public API. The annotated names come from parsing the file (its layout: `---@class C`,
-- then `local X = {}`, then `function X.f` / `function X:m` and `---@field f` lines); the real
-- names from a server whose handler walks k, k.log, k.json, req, res, a deferred reply, a shared
-- dict, a timer handle, an SSE stream and a WebSocket: their keys, their metatables' __index tables, and the method tables
-- an __index function reaches (its table upvalues holding functions); names starting with "_"
-- are private. Each annotated name must also index to something, so a lazy member counts.
-- A failure names every missing name, in both directions.
local server = require "helpers.server"

-- class in the annotations -> the label of the object the app walks
local OBJECTS = {
    ["khamsin"] = "k", ["khamsin.log"] = "k.log", ["khamsin.json"] = "k.json",
    ["khamsin.Request"] = "req", ["khamsin.Response"] = "res", ["khamsin.Deferred"] = "d",
    ["khamsin.SharedDict"] = "dict", ["khamsin.Timer"] = "timer",
    ["khamsin.Multipart"] = "multipart", ["khamsin.Part"] = "part",
    ["khamsin.socket"] = "k.socket", ["khamsin.Socket"] = "sock",
    ["khamsin.http"] = "k.http", ["khamsin.HttpResponse"] = "hres",
    ["khamsin.SSE"] = "sse", ["khamsin.WebSocket"] = "ws",
}

-- Names annotated ahead of the code that adds them: missing from the module is not an error for
-- these (empty: everything annotated exists).
local PENDING = {}

-- Parses the annotations: {label = {name = true}}.
local function annotated(path)
    local f = assert(io.open(path))
    local text = f:read("*a")
    f:close()
    local out, alias, class = {}, {}, nil
    local bind_next = false
    for line in text:gmatch("[^\n]*") do
        local c = line:match("^%-%-%-@class%s+([%w_.]+)")
        if c then
            class = c
            assert(OBJECTS[c], "library/khamsin.lua: class " .. c .. " is not in spec/meta_spec.lua's OBJECTS")
            out[OBJECTS[c]] = out[OBJECTS[c]] or {}
            bind_next = true
        else
            local field = line:match("^%-%-%-@field%s+([%w_]+)")
            if field and class then
                out[OBJECTS[class]][field] = true
            elseif not line:match("^%-%-") and line:match("%S") then
                local a = line:match("^local%s+([%w_]+)%s*=%s*{}")
                if a and bind_next then alias[a] = OBJECTS[class] end
                bind_next = false
                local obj, name = line:match("^function%s+([%w_]+)[.:]([%w_]+)%s*%(")
                if obj then
                    assert(alias[obj], "library/khamsin.lua: function " .. obj .. "." .. name
                        .. " on a table that is not bound to a ---@class")
                    out[alias[obj]][name] = true
                end
            end
        end
    end
    return out
end

-- The app: for each label, "have LABEL NAME" for each name it finds, and "index LABEL NAME"
-- for each annotated name that indexes to a non-nil value.
local function app_source(want)
    local parts = {}
    for label, names in pairs(want) do
        local list = {}
        for n in pairs(names) do list[#list + 1] = string.format("%q", n) end
        parts[#parts + 1] = string.format("[%q] = { %s }", label, table.concat(list, ", "))
    end
    return [[
local k = require "khamsin"
local WANT = { ]] .. table.concat(parts, ",\n") .. [[ }
local dict = k.shared_dict("meta", 65536)

local function walk(label, obj, out)
    local found = {}
    local function add(t, only_functions)
        for key, v in pairs(t) do
            if type(key) == "string" and key:sub(1, 1) ~= "_"
                and (not only_functions or type(v) == "function") then
                found[key] = true
            end
        end
    end
    if obj == nil then return end
    for _, n in ipairs(WANT[label] or {}) do -- touch them first: lazy members appear
        local ok, v = pcall(function() return obj[n] end)
        if ok and v ~= nil then out[#out + 1] = "index " .. label .. " " .. n end
    end
    if type(obj) == "table" then add(obj) end
    local mt = getmetatable(obj)
    local idx = type(mt) == "table" and mt.__index
    if type(idx) == "table" then
        add(idx)
    elseif type(idx) == "function" then
        for i = 1, 200 do
            local name, v = debug.getupvalue(idx, i)
            if not name then break end
            if type(v) == "table" and v ~= obj then add(v, true) end
        end
    end
    for n in pairs(found) do out[#out + 1] = "have " .. label .. " " .. n end
end

-- an SSE stream and a WebSocket walked where they exist; their lines go to a shared dict that
-- "/" reads after fetching them itself
local function walked(label, obj)
    local out = {}
    walk(label, obj, out)
    dict:set(label, table.concat(out, "\n") .. "\n")
end
k.get("/sse", function(req, res)
    local sse = res:sse()
    walked("sse", sse)
    sse:close()
end)
k.websocket("/ws", {
    protocols = { "chat" },
    open = function(ws) walked("ws", ws); ws:close(1000) end,
})
k.get("/", function(req, res)
    if req.args.inner then return "inner" end
    local out = {}
    walk("k", k, out)
    walk("k.log", k.log, out)
    walk("k.json", rawget(k, "json") or k.json, out)
    walk("k.socket", k.socket, out)
    walk("sock", k.socket.tcp(), out)
    walk("k.http", k.http, out)
    walk("hres", (k.http.get("http://" .. req.headers.host .. "/?inner=1")), out)
    walk("req", req, out)
    walk("res", res, out)
    walk("dict", dict, out)
    local mp = req:multipart() -- the request's body is a one-file multipart form
    walk("multipart", mp, out)
    walk("part", mp:part(), out)
    local t = k.timer(1000, function() end)
    walk("timer", t, out)
    t:cancel()
    local d = res:defer()
    walk("d", d, out)
    d:send(200, table.concat(out, "\n") .. "\n" .. (dict:get("sse") or "") .. (dict:get("ws") or ""))
end)
]]
end

local function sorted(set)
    local l = {}
    for n in pairs(set) do l[#l + 1] = n end
    table.sort(l)
    return l
end

describe("LuaLS annotations (library/khamsin.lua)", function()
    it("name every public function and field of the module, and nothing else", function()
        local want = annotated(server.root .. "/library/khamsin.lua")
        assert.truthy(want.k and want.k.get and want.req and want.req.body, "the parser found nothing")
        local srv = server.start { app = app_source(want), tls = false, workers = 1 }
        -- the SSE stream and the WebSocket are walked by their own requests first
        local s = srv:request { path = "/sse", headers = { ["Last-Event-ID"] = "7" } }
        assert.are.equal(200, s.status)
        local py = io.popen("/usr/bin/python3 -c " .. server.sh_quote(
            "import asyncio, websockets\n"
            .. "async def main():\n"
            .. "    async with websockets.connect('ws://127.0.0.1:" .. srv.port .. "/ws', subprotocols=['chat']) as w:\n"
            .. "        try:\n"
            .. "            await asyncio.wait_for(w.recv(), 10)\n"
            .. "        except websockets.ConnectionClosed:\n"
            .. "            pass\n"
            .. "asyncio.run(main())\n") .. " 2>&1")
        local pyout = py:read("*a")
        py:close()
        assert.are.equal("", pyout)
        local r = srv:request { path = "/?x=1", headers = { Cookie = "a=b", ["X-Request-Id"] = "meta",
            ["Content-Type"] = "multipart/form-data; boundary=b" },
            body = '--b\r\nContent-Disposition: form-data; name="f"; filename="f.txt"\r\n'
                .. "Content-Type: text/plain\r\n\r\nx\r\n--b--\r\n" }
        srv:stop()
        assert.are.equal(200, r.status, r.body)
        local have = {}
        for kind, label, name in r.body:gmatch("(%a+) (%S+) (%S+)\n") do
            have[label] = have[label] or {}
            have[label][name] = kind
        end
        local not_annotated, not_in_module, pending = {}, {}, {}
        for label, names in pairs(have) do
            for name, kind in pairs(names) do
                if kind == "have" and not (want[label] and want[label][name]) then
                    not_annotated[label .. "." .. name] = true
                end
            end
        end
        for label, names in pairs(want) do
            for name in pairs(names) do
                local full = label .. "." .. name
                if not (have[label] and have[label][name]) then
                    if PENDING[full] then pending[#pending + 1] = full else not_in_module[full] = true end
                end
            end
        end
        local msg = {}
        if next(not_annotated) then
            msg[#msg + 1] = "in the module, not annotated in library/khamsin.lua: "
                .. table.concat(sorted(not_annotated), ", ")
        end
        if next(not_in_module) then
            msg[#msg + 1] = "annotated in library/khamsin.lua, not in the module: "
                .. table.concat(sorted(not_in_module), ", ")
        end
        assert(#msg == 0, table.concat(msg, "\n"))
    end)

    it("the parser sees every class and method of the file", function()
        local want = annotated(server.root .. "/library/khamsin.lua")
        for _, label in ipairs { "k", "k.log", "k.json", "req", "res", "d", "dict", "timer",
            "k.socket", "sock", "k.http", "hres", "sse", "ws" } do
            assert.truthy(want[label] and next(want[label]), "no names for " .. label)
        end
        assert.truthy(want.res.defer and want.d.send and want.dict.incr and want.timer.cancel
            and want.k.log and want.req.method)
    end)
end)
