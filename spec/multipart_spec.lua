-- req:multipart(): multipart/form-data over h1, h1+tls, h2c and h2, from curl -F and from
-- Python's email package: fields and files in memory and on disk (temp files removed when the
-- handler returns), parts streamed chunk by chunk, filename* (RFC 8187), the limits (400 with
-- the reason: parts, header block, part size, total), malformed bodies (400), another
-- Content-Type (415), and misuse raised at the app's line.
local server = require "helpers.server"
local cjson = require "cjson"

local APP = [[
local k = require "khamsin"
local function pool_read(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local d = f:read("*a")
    f:close()
    return d
end
local function pool_exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
end
k.post("/all", function(req)
    local f = req:multipart():all()
    local files = {}
    for name, file in pairs(f.files) do
        if file[1] then file = file[#file] end
        files[name] = { filename = file.filename, content_type = file.content_type,
            size = file.size, data = file.data }
    end
    return { fields = f.fields, files = files }
end)
local last
k.post("/disk", function(req)
    local f = req:multipart{ files = "disk", tmp_dir = os.getenv("KH_TMP") }:all()
    local file = f.files.upload
    last = file.path
    return { path = file.path, size = file.size, filename = file.filename,
        same = k.blocking(pool_read, file.path) == f.fields.expect,
        mode = k.blocking(function(p)
            local h = io.popen("stat -c %a " .. p); local m = h:read("*l"); h:close(); return m
        end, file.path) }
end)
k.get("/exists", function(req) return tostring(k.blocking(pool_exists, last)) end)
k.post("/stream", function(req)
    local out = {}
    for part in req:multipart():parts() do
        local n, chunks = 0, 0
        while true do
            local c = part:read()
            if not c then break end
            n, chunks = n + #c, chunks + 1
        end
        out[#out + 1] = { name = part.name, filename = part.filename or false, bytes = n,
            disposition = part.headers["content-disposition"] }
    end
    return out
end)
k.post("/limits/:which", function(req)
    local w = req.params.which
    local opts = ({ parts = { max_parts = 2 }, header = { max_header_bytes = 100 },
        part = { max_part_bytes = 10 }, total = { max_total_bytes = 200 } })[w]
    local f = req:multipart(opts):all()
    return "ok"
end)
k.post("/misuse", function(req)
    local ok, e = pcall(req.multipart, req, { files = "tape" })
    return tostring(ok) .. " " .. tostring(e)
end)
]]

-- A body by hand (CRLF lines), for the malformed cases and exact bytes.
local function body(boundary, parts, close)
    local t = {}
    for _, p in ipairs(parts) do
        t[#t + 1] = "--" .. boundary .. "\r\n" .. p .. "\r\n"
    end
    t[#t + 1] = close or ("--" .. boundary .. "--\r\n")
    return table.concat(t)
end

describe("req:multipart()", function()
    local srv, tmp
    setup(function()
        tmp = os.tmpname()
        os.remove(tmp)
        assert(os.execute("mkdir -p " .. tmp) == 0 or true)
        srv = server.start { app = APP, env = { KH_TMP = tmp } }
    end)
    teardown(function()
        if srv then srv:stop() end
        if tmp then os.execute("rm -rf " .. tmp) end
    end)

    server.each_protocol(function(proto)
        describe("over " .. proto, function()
            local function post(path, b, ctype)
                return srv:request { proto = proto, method = "POST", path = path, body = b,
                    headers = { ["Content-Type"] = ctype } }
            end
            local function curl_f(path, args)
                return srv:request { proto = proto, method = "POST", path = path, curl_args = args }
            end

            it("reads curl -F fields and files into memory", function()
                local file = tmp .. "/in-" .. proto .. ".bin"
                local data = {}
                for i = 0, 255 do data[#data + 1] = string.char(i) end
                -- binary bytes, CRLFs and near-delimiters inside the file
                data = table.concat(data):rep(40) .. "\r\n--\r\n-" .. ("x"):rep(1000)
                server.write_file(file, data)
                local r = curl_f("/all", { "-F", "title=hello world", "-F", "tag=a", "-F", "tag=b",
                    "-F", "upload=@" .. file .. ";type=application/octet-stream;filename=caf\xc3\xa9.bin" })
                assert.are.equal(200, r.status, r.body)
                local j = cjson.decode(r.body)
                assert.are.same({ title = "hello world", tag = { "a", "b" } }, j.fields)
                local u = j.files.upload
                assert.are.equal("caf\xc3\xa9.bin", u.filename)
                assert.are.equal("application/octet-stream", u.content_type)
                assert.are.equal(#data, u.size)
                assert.are.equal(data, u.data)
            end)

            it("writes file parts to a 0600 temp file in tmp_dir, removed after the handler", function()
                local data = ("0123456789abcdef\r\n"):rep(10000) -- 180 KB: several pool writes
                local file = tmp .. "/up-" .. proto .. ".txt"
                server.write_file(file, data)
                local r = curl_f("/disk", { "-F", "expect=<" .. file, "-F", "upload=@" .. file })
                assert.are.equal(200, r.status, r.body)
                local j = cjson.decode(r.body)
                assert.are.equal(#data, j.size)
                assert.is_true(j.same)
                assert.are.equal("600", j.mode)
                assert.are.equal(tmp .. "/", j.path:sub(1, #tmp + 1))
                assert.are.equal("up-" .. proto .. ".txt", j.filename)
                assert.are.equal("false", srv:request { proto = proto, path = "/exists" }.body)
                assert.is_nil(io.open(j.path))
            end)

            it("streams parts: headers first, then the data in chunks", function()
                local b = body("XyZ", {
                    'Content-Disposition: form-data; name="a"\r\n\r\n' .. ("A"):rep(70000),
                    'Content-Disposition: form-data; name="f"; filename*=UTF-8\'\'%C3%A9t%C3%A9.txt\r\n'
                        .. "Content-Type: text/plain\r\n\r\n",
                }, "--XyZ--")
                local r = post("/stream", b, "multipart/form-data; boundary=\"XyZ\"")
                assert.are.equal(200, r.status, r.body)
                local j = cjson.decode(r.body)
                assert.are.equal(2, #j)
                assert.are.same({ name = "a", filename = false, bytes = 70000,
                    disposition = 'form-data; name="a"' }, j[1])
                assert.are.equal("été.txt", j[2].filename)
                assert.are.equal(0, j[2].bytes)
            end)

            it("reads a body made by Python's email package", function()
                -- the generator turns bare CR and LF into CRLF, so the file holds no CR/LF
                local script = [[
import sys, io, email.policy, email.encoders
from email.mime.multipart import MIMEMultipart
from email.mime.application import MIMEApplication
from email.mime.base import MIMEBase
from email.generator import BytesGenerator
m = MIMEMultipart("form-data")
t = MIMEBase("text", "plain"); t.set_payload("hello from python"); t.add_header("Content-Disposition", "form-data", name="note"); m.attach(t)
a = MIMEApplication(bytes(range(32, 256)) * 4, "octet-stream", _encoder=email.encoders.encode_noop)
a.add_header("Content-Disposition", "form-data", name="bin", filename="b.dat"); m.attach(a)
buf = io.BytesIO(); BytesGenerator(buf, mangle_from_=False, policy=email.policy.HTTP).flatten(m)
raw = buf.getvalue(); head, _, body = raw.partition(b"\r\n\r\n")
sys.stdout.write(m.get_boundary() + "\n"); sys.stdout.flush(); sys.stdout.buffer.write(body)
]]
                local sp = tmp .. "/mk.py"
                server.write_file(sp, script)
                local h = io.popen("/usr/bin/python3 " .. sp)
                local boundary = h:read("*l")
                local b = h:read("*a")
                h:close()
                local r = post("/all", b, "multipart/form-data; boundary=\"" .. boundary .. "\"")
                assert.are.equal(200, r.status, r.body)
                local j = cjson.decode(r.body)
                assert.are.equal("hello from python", j.fields.note)
                local want = {}
                for i = 32, 255 do want[#want + 1] = string.char(i) end
                assert.are.equal(table.concat(want):rep(4), j.files.bin.data)
                assert.are.equal("b.dat", j.files.bin.filename)
            end)

            it("refuses past each limit with 400 and the reason", function()
                local cd = 'Content-Disposition: form-data; name="x"\r\n\r\n'
                local cases = {
                    { "parts", body("b", { cd .. "1", cd .. "2", cd .. "3" }), "too many multipart parts" },
                    { "header", body("b", { "X-Long: " .. ("h"):rep(200) .. "\r\n" .. cd }), "header block is too large" },
                    { "part", body("b", { cd .. ("p"):rep(11) }), "part is too large" },
                    { "total", body("b", { cd .. ("t"):rep(300) }), "body is too large" },
                }
                for _, c in ipairs(cases) do
                    local r = post("/limits/" .. c[1], c[2], "multipart/form-data; boundary=b")
                    assert.are.equal(400, r.status, c[1] .. ": " .. r.body)
                    assert.truthy(r.body:find(c[3], 1, true), r.body)
                end
                local ok = post("/limits/parts", body("b", { cd .. "1", cd .. "2" }), "multipart/form-data; boundary=b")
                assert.are.equal(200, ok.status, ok.body)
            end)

            it("refuses malformed bodies with 400 and the reason", function()
                local cd = 'Content-Disposition: form-data; name="x"\r\n\r\n'
                local cases = {
                    { body("b", { cd .. "v" }, "--b"), "boundary=b", "ends before its close delimiter" },
                    { "no delimiter here", "boundary=b", "has no multipart delimiter" },
                    { body("b", { "Content-Type: text/plain\r\n\r\nv" }), "boundary=b", "no Content-Disposition" },
                    { body("b", { "Content-Disposition form-data\r\n\r\nv" }), "boundary=b", "not 'name: value'" },
                    { body("b", { cd .. "v" }), "charset=utf-8", "has no boundary" },
                    { body("b", { cd .. "v" }), "boundary=" .. ("b"):rep(71), "1 to 70 characters" },
                    { "--b\r\n" .. cd .. "v\r\n--b x", "boundary=b", "something else than CRLF" },
                }
                for i, c in ipairs(cases) do
                    local r = post("/all", c[1], "multipart/form-data; " .. c[2])
                    assert.are.equal(400, r.status, i .. ": " .. r.body .. tostring(r.err))
                    assert.truthy(r.body:find(c[3], 1, true), i .. ": " .. r.body)
                end
            end)

            it("answers 415 for another Content-Type", function()
                local r = post("/all", "a=1", "application/x-www-form-urlencoded")
                assert.are.equal(415, r.status)
            end)

            it("raises a misuse at the app's line", function()
                local r = post("/misuse", "", "multipart/form-data; boundary=b")
                assert.truthy(r.body:find("^false [^ ]*app%.lua:%d+: req:multipart%(opts%)"), r.body)
            end)
        end)
    end)
end)
