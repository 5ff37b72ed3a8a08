-- req:multipart() reads through req:body_reader(): on a route declared { stream_body = true } an
-- upload far past body_bytes streams through the parser part by part (max_total_bytes bounds it),
-- and the server's memory stays bounded; without stream_body, body_bytes still answers 413.
local server = require "helpers.server"

local APP = [[
local k = require "khamsin"
local function count(req)
  local r = req:multipart{ max_part_bytes = 64 * 1024 * 1024, max_total_bytes = 64 * 1024 * 1024 }
  local total, names = 0, {}
  for part in r:parts() do
    names[#names + 1] = part.name
    while true do
      local c = part:read()
      if not c then break end
      total = total + #c
    end
  end
  return table.concat(names, ",") .. " " .. total
end
k.post("/stream", count, { stream_body = true })
k.post("/buffered", count)
]]

local function rss_kib(pid)
    local f = io.open("/proc/" .. pid .. "/status")
    if not f then return nil end
    local s = f:read("*a"); f:close()
    return tonumber(s:match("VmRSS:%s+(%d+)"))
end

describe("req:multipart over req:body_reader", function()
    local srv, file
    setup(function()
        -- ASan's quarantine (256 MB by default) would show freed chunks in VmRSS: keep it small
        local asan = os.getenv("ASAN_OPTIONS") or ""
        asan = (asan ~= "" and asan .. ":" or "") .. "quarantine_size_mb=1"
        srv = server.start { app = APP, workers = 1, tls = false, args = { "--body-bytes", "1048576" },
            env = { ASAN_OPTIONS = asan } }
        file = srv.dir .. "/big.bin"
        os.execute("head -c 40000000 /dev/urandom > " .. file)
    end)
    teardown(function() if srv then srv:stop() end end)

    for _, p in ipairs { { "h1", "--http1.1" }, { "h2c", "--http2-prior-knowledge" } } do
        it("streams a 40 MB upload past body_bytes=1 MiB with bounded memory (" .. p[1] .. ")", function()
            local before = rss_kib(srv.pid)
            local out = srv.dir .. "/out"
            os.execute("curl -s " .. p[2] .. " -F a=hello -F f=@" .. file .. " -o " .. out
                .. " --max-time 120 " .. server.sh_quote(srv:url("/stream")))
            assert.are.equal("a,f 40000005", server.read_file(out))
            local after = rss_kib(srv.pid)
            if before and after then
                -- 40 MB went through; buffering it would add at least that much
                assert.truthy(after - before < 30 * 1024, ("RSS grew %d KiB"):format(after - before))
            end
        end)
    end

    it("a route without stream_body still answers 413 past body_bytes", function()
        local out = srv.dir .. "/out413"
        local p = io.popen("curl -s -o " .. out .. " -w '%{http_code}' -F f=@" .. file
            .. " --max-time 60 " .. server.sh_quote(srv:url("/buffered")))
        local code = p:read("*a"); p:close()
        assert.are.equal("413", code)
    end)
end)
