-- k.static beyond small files (issue 13 item 6): a large file is streamed under backpressure
-- (a 50 MB download to a slow reader keeps the server's RSS bounded, bytes intact), Range and
-- HEAD on a streamed file, and the per-worker cache: a changed, removed or created file is seen
-- within the revalidation period (cache.valid), and cache options are checked at load.
local server = require "helpers.server"

local MB = 1024 * 1024

local APP = [[
local k = require "khamsin"
local root = os.getenv("KH_STATIC_ROOT")
k.static("/s", root)
k.static("/nocache", root, { cache = false })
k.static("/tiny", root, { cache = { valid = 0.2, entries = 2, file_bytes = 16, total_bytes = 32 } })
k.get("/gc", function() collectgarbage() collectgarbage() return "ok" end)
k.get("/misuse", function(req)
    local opts = ({
        a = { cache = "yes" }, b = { cache = { bogus = 1 } }, c = { cache = { entries = 0 } },
        d = { cache = { valid = -1 } },
    })[req.query]
    local ok, e = pcall(k.static, "/late" .. req.query, root, opts)
    return tostring(ok) .. " " .. tostring(e)
end)
]]

local function rss(srv)
    local s = assert(server.read_file("/proc/" .. srv.pid .. "/status"))
    return tonumber(s:match("VmRSS:%s*(%d+) kB")) * 1024
end

describe("k.static streaming and cache", function()
    local srv, base, root
    -- ASan's quarantine would show freed chunks in VmRSS: keep it small for the RSS check
    local asan = (os.getenv("ASAN_OPTIONS") or "")
    asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
    setup(function()
        base = os.tmpname()
        os.remove(base)
        root = base .. "/root"
        assert(os.execute("mkdir -p " .. root))
        -- 50 MB of numbered lines: any lost, duplicated or reordered chunk changes the bytes
        assert(os.execute("seq -f '%015.0f' 1 " .. (50 * MB / 16) .. " > " .. root .. "/big.bin"))
        server.write_file(root .. "/v.txt", "version-1")
        srv = server.start { app = APP, workers = 1, env = { KH_STATIC_ROOT = root, ASAN_OPTIONS = asan } }
    end)
    teardown(function()
        if srv then srv:stop() end
        if base then os.execute("rm -rf " .. base) end
    end)

    for _, proto in ipairs { "h1", "h2c" } do
        local flag = proto == "h1" and "--http1.1" or "--http2-prior-knowledge"
        it("streams a 50 MB file to a slow reader, RSS bounded, bytes intact (" .. proto .. ")", function()
            local out = srv.dir .. "/big." .. proto
            assert.are.equal(200, srv:request { path = "/s/v.txt", proto = proto }.status) -- warm up
            local before = rss(srv)
            local done = srv.dir .. "/dl." .. proto .. ".done"
            os.execute("(curl -s " .. flag .. " --limit-rate 20M --max-time 300 -D " .. out .. ".h -o "
                .. out .. " " .. server.sh_quote(srv:url("/s/big.bin")) .. "; echo $? > " .. done
                .. ") >/dev/null 2>&1 &")
            local peak = 0
            local code = server.wait_until(320, function()
                peak = math.max(peak, rss(srv))
                local s = server.read_file(done)
                return s and tonumber(s:match("%d+"))
            end, 0.05)
            assert.are.equal(0, code)
            assert.is_true(os.execute("cmp -s " .. out .. " " .. root .. "/big.bin") == 0
                or os.execute("cmp -s " .. out .. " " .. root .. "/big.bin") == true)
            local head = server.read_file(out .. ".h"):lower()
            assert.truthy(head:find("content%-length: " .. 50 * MB), head)
            print(string.format("\n  %s: 50 MB file streamed, VmRSS +%.1f MB at the peak", proto,
                (peak - before) / MB))
            assert.is_true(peak - before < 20 * MB,
                string.format("RSS grew by %.1f MB while serving 50 MB", (peak - before) / MB))
        end)

        it("answers ranges and HEAD of a streamed file (" .. proto .. ")", function()
            local r = srv:request { path = "/s/big.bin", proto = proto, headers = { Range = "bytes=16000000-16000031" } }
            assert.are.equal(206, r.status)
            assert.are.equal("000000001000001\n000000001000002\n", r.body)
            assert.are.equal("bytes 16000000-16000031/" .. 50 * MB, r.headers["content-range"])
            r = srv:request { path = "/s/big.bin", proto = proto, headers = { Range = "bytes=-16" } }
            assert.are.equal(206, r.status)
            assert.are.equal(string.format("%015d\n", 50 * MB / 16), r.body)
            -- a range that spans several 64 KiB reads
            r = srv:request { path = "/s/big.bin", proto = proto, headers = { Range = "bytes=65530-196619" } }
            assert.are.equal(206, r.status)
            assert.are.equal(131090, #r.body)
            assert.are.equal("\n", r.body:sub(6, 6)) -- byte 65536 starts line 4097
            assert.are.equal("000000000004097\n", r.body:sub(7, 22))
            r = srv:request { path = "/s/big.bin", proto = proto, method = "HEAD" }
            assert.are.equal(200, r.status)
            assert.are.equal(tostring(50 * MB), r.headers["content-length"])
            assert.are.equal("", r.body)
        end)
    end

    it("closes the file of a download the client left (no fd leak), and still serves", function()
        local function fds()
            local p = io.popen("ls /proc/" .. srv.pid .. "/fd | wc -l")
            local n = tonumber(p:read("*a"))
            p:close()
            return n
        end
        assert.are.equal("ok", srv:request { path = "/gc" }.body)
        local before = fds()
        for i = 1, 4 do
            local flag = i % 2 == 0 and "--http1.1" or "--http2-prior-knowledge"
            os.execute("curl -s " .. flag .. " --limit-rate 2M --max-time 0.5 -o /dev/null "
                .. server.sh_quote(srv:url("/s/big.bin")) .. " 2>/dev/null")
        end
        assert.truthy(server.wait_until(20, function()
            srv:request { path = "/gc" }
            return fds() <= before
        end, 0.2), "fds before " .. before .. ", now " .. fds())
        local r = srv:request { path = "/s/big.bin", headers = { Range = "bytes=0-15" } }
        assert.are.equal("000000000000001\n", r.body)
    end)

    it("sees a changed file within the revalidation period (same size too)", function()
        server.write_file(root .. "/v.txt", "version-1")
        assert.truthy(server.wait_until(5, function()
            return srv:request { path = "/s/v.txt" }.body == "version-1"
        end))
        server.write_file(root .. "/v.txt", "version-2") -- same size: mtime (ns) / inode differ
        local t0 = server.now()
        assert.truthy(server.wait_until(5, function()
            return srv:request { path = "/s/v.txt" }.body == "version-2"
        end, 0.05))
        assert.is_true(server.now() - t0 < 4, "seen after " .. (server.now() - t0) .. " s")
        server.write_file(root .. "/v.txt", "a longer version-3")
        assert.truthy(server.wait_until(5, function()
            local r = srv:request { path = "/s/v.txt" }
            return r.body == "a longer version-3" and r.headers["content-length"] == "18"
        end, 0.05))
        -- removed: 404 within the period; created again: served
        os.remove(root .. "/v.txt")
        assert.truthy(server.wait_until(5, function() return srv:request { path = "/s/v.txt" }.status == 404 end, 0.05))
        server.write_file(root .. "/v.txt", "back")
        assert.truthy(server.wait_until(5, function() return srv:request { path = "/s/v.txt" }.body == "back" end, 0.05))
    end)

    it("with cache = false a change is seen at once; a tiny cache stays correct", function()
        server.write_file(root .. "/n.txt", "one")
        assert.are.equal("one", srv:request { path = "/nocache/n.txt" }.body)
        server.write_file(root .. "/n.txt", "two")
        assert.are.equal("two", srv:request { path = "/nocache/n.txt" }.body)
        -- 2 entries, 16-byte files, 32 bytes in all: eviction and files above the cap
        for i = 1, 6 do server.write_file(root .. "/t" .. i .. ".txt", string.rep(tostring(i), i * 5)) end
        for _ = 1, 3 do
            for i = 1, 6 do
                local r = srv:request { path = "/tiny/t" .. i .. ".txt" }
                assert.are.equal(200, r.status)
                assert.are.equal(string.rep(tostring(i), i * 5), r.body)
            end
        end
        local r = srv:request { path = "/tiny/t5.txt", headers = { Range = "bytes=2-4" } }
        assert.are.equal(206, r.status)
        assert.are.equal("555", r.body)
    end)

    it("checks cache options at load", function()
        assert.truthy(srv:request { path = "/misuse?a" }.body:find("false .*cache must be false, true or a table"))
        assert.truthy(srv:request { path = "/misuse?b" }.body:find("false .*unknown cache option 'bogus'"))
        assert.truthy(srv:request { path = "/misuse?c" }.body:find("false .*cache.entries must be a positive integer"))
        assert.truthy(srv:request { path = "/misuse?d" }.body:find("false .*cache.valid must be a number >= 0"))
    end)
end)
