-- bench/apps/json_codec.lua: k.json vs lua-cjson, encode + decode of a ~1 KB JSON document in a
-- loop, in one worker's LuaJIT state (run by bench/json.sh with the release build). Prints one
-- line per codec and exits while the script loads.
local k = require "khamsin"
local cjson = require "cjson"
local N = tonumber(os.getenv("N") or "200000")
local doc = [[{"id":12345,"name":"Widget Pro","active":true,"price":19.99,"tags":["tools","hardware","sale"],"owner":{"id":7,"login":"alice","email":"alice@example.com","roles":["admin","editor"]},"items":[{"sku":"A-1","qty":2,"price":3.5,"note":"fragile"},{"sku":"B-22","qty":1,"price":120.25,"note":"ships in 2 days"},{"sku":"C-333","qty":10,"price":0.99,"note":null}],"address":{"street":"1 Main Street","city":"Springfield","zip":"12345","geo":{"lat":39.7817,"lon":-89.6501}},"history":[{"at":"2026-01-01T10:00:00Z","event":"created","by":"alice"},{"at":"2026-01-02T11:30:00Z","event":"updated","by":"bob"},{"at":"2026-01-03T09:15:00Z","event":"shipped","by":"carol"}],"description":"A widget for everyday use, made of steel and plastic, with a two year warranty, free returns within 30 days, and support by mail or phone on work days.","related":[{"id":1,"name":"Widget Mini","price":9.5},{"id":2,"name":"Widget Max","price":29.75},{"id":3,"name":"Widget Set","price":49}],"rating":4.6,"reviews":1289,"currency":"EUR"}]]
local function run(name, enc, dec)
    local v = dec(doc)
    local out = enc(v)
    assert(#out > 900 and #doc >= 1000, #doc .. " " .. #out)
    for _ = 1, math.floor(N / 10) do enc(dec(doc)) end -- warm up (JIT traces)
    collectgarbage()
    local t0 = os.clock()
    for _ = 1, N do out = enc(dec(doc)) end
    local dt = os.clock() - t0
    t0 = os.clock()
    for _ = 1, N do out = enc(v) end
    local de = os.clock() - t0
    t0 = os.clock()
    for _ = 1, N do v = dec(doc) end
    local dd = os.clock() - t0
    print(string.format("%-8s %d bytes in, %d out: %.2f us per decode+encode (encode %.2f, decode %.2f; %d rounds)",
        name, #doc, #out, dt / N * 1e6, de / N * 1e6, dd / N * 1e6, N))
end
run("cjson", cjson.encode, cjson.decode)
run("k.json", k.json.encode, k.json.decode)
os.exit(0)
