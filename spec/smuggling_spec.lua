-- Request smuggling and request-handling oddities, tried from outside as an independent check
-- would (issue 8's smuggling battery behind nginx, held-out conformance suites):
-- * direct: each smuggling payload carries a second request ("GET /smuggled ...") where some
--   reader of the framing could find one. Refused payloads must get exactly the given status,
--   one answer and the close; accepted ones exactly the answers a strict reader gives, never
--   "SMUGGLED" from a request the framing did not make.
-- * behind nginx with a keep-alive upstream pool (the setup where a desync poisons the next
--   client's request): every payload is sent, then victims on fresh connections must each get
--   their own answer, never "SMUGGLED". The smuggled prefix ends in an open header line, so a
--   desynced upstream connection would glue it to a victim's request.
-- * path payloads beyond spec/paths_spec.lua (double encoding, %u, matrix params, fullwidth
--   dots, overlong UTF-8), direct and through nginx with and without a URI part in proxy_pass:
--   never the /admin route through nginx's `location /admin/ { return 403; }`.
-- * HEAD: no answer to a HEAD request carries content, the engine's own error replies included.
-- * a bad request line is answered at its CRLF (HTTP/0.9 clients send no blank line).
-- Peer garbage must never produce an [error] log line: srv:stop() fails the block if it does.
local server = require "helpers.server"
local nginx = require "helpers.nginx"

local APP = [[
local k = require "khamsin"
k.get("/p", function(req) return "p:" .. req.path end)
k.post("/echo", function(req) return "echo:" .. req:body() end)
k.get("/smuggled", function() return "SMUGGLED" end)
k.post("/smuggled", function() return "SMUGGLED" end)
k.get("/admin/*rest", function(req) return "ADMIN " .. req.params.rest end)
k.get("/public/*rest", function(req) return "public " .. req.params.rest end)
]]

local SMUG = "GET /smuggled HTTP/1.1\r\nHost: x\r\nX-Ignore: " -- open: eats the next request line
local H = "POST /echo HTTP/1.1\r\nHost: x\r\n"

-- The framing payloads (name, head + body); %d / %x take #SMUG where a length is needed.
local L = #SMUG
local PAYLOADS = {
    { "CL.TE", H .. ("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"):format(5 + L) .. SMUG },
    { "TE.CL", H .. ("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE.TE, space before the colon", H .. "Transfer-Encoding: chunked\r\nTransfer-Encoding : x\r\n"
        .. ("Content-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE with a tab and CL", H .. ("Transfer-Encoding:\tchunked\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE 'chunked ' and CL", H .. ("Transfer-Encoding: chunked \r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE xchunked and CL", H .. ("Transfer-Encoding: xchunked\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE 'chunked,' and CL", H .. ("Transfer-Encoding: chunked,\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE chunked then identity", H .. "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n"
        .. ("Content-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE in HTTP/1.0", ("POST /echo HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L)
        .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE obs-folded", H .. ("Transfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "TE after a vertical tab", H .. ("Transfer-Encoding:\11chunked\r\nContent-Length: 4\r\n\r\n%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "CL 0 then CL n", H .. ("Content-Length: 0\r\nContent-Length: %d\r\n\r\n"):format(L) .. SMUG },
    { "CL list 0, n", H .. ("Content-Length: 0, %d\r\n\r\n"):format(L) .. SMUG },
    { "CL with +", H .. ("Content-Length: +%d\r\n\r\n"):format(L) .. SMUG },
    { "CL with space before the colon", H .. ("Content-Length : %d\r\n\r\n"):format(L) .. SMUG },
    { "chunk size line ending in LF", H .. ("Transfer-Encoding: chunked\r\n\r\n%x\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "chunk-ext with a bare LF", H .. "Transfer-Encoding: chunked\r\n\r\n1;a\nx\r\n0\r\n\r\n" .. SMUG },
    { "chunk size over 64 bits", H .. ("Transfer-Encoding: chunked\r\n\r\n1000000000000000%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "chunk size 0x..", H .. ("Transfer-Encoding: chunked\r\n\r\n0x%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "chunk data without its CRLF", H .. ("Transfer-Encoding: chunked\r\n\r\n1\r\nxZZ%x\r\n"):format(L) .. SMUG .. "\r\n0\r\n\r\n" },
    { "last-chunk ending in LF", H .. "Transfer-Encoding: chunked\r\n\r\n0\n\r\n" .. SMUG },
    { "trailer line ending in LF", H .. "Transfer-Encoding: chunked\r\n\r\n0\r\nX: y\n\r\n" .. SMUG },
    { "bare CR hiding a CL", H .. ("X: a\rContent-Length: %d\r\nContent-Length: 0\r\n\r\n"):format(L) .. SMUG },
    { "NUL in a field value", H .. ("X: a\0\r\nContent-Length: %d\r\n\r\n"):format(L) .. SMUG },
    { "LF-only head", ("POST /echo HTTP/1.1\nHost: x\nContent-Length: %d\n\n"):format(L) .. SMUG },
}

-- What the engine answers each of them directly (one answer, then the close).
local DIRECT = {
    ["CL.TE"] = 400, ["TE.CL"] = 400, ["TE.TE, space before the colon"] = 400,
    ["TE with a tab and CL"] = 400, ["TE 'chunked ' and CL"] = 400, ["TE xchunked and CL"] = 400,
    ["TE 'chunked,' and CL"] = 400, ["TE chunked then identity"] = 400, ["TE in HTTP/1.0"] = 400,
    ["TE obs-folded"] = 400, ["TE after a vertical tab"] = 400, ["CL 0 then CL n"] = 400,
    ["CL list 0, n"] = 400, ["CL with +"] = 400, ["CL with space before the colon"] = 400,
    ["chunk size line ending in LF"] = 400, ["chunk-ext with a bare LF"] = 400,
    ["chunk size over 64 bits"] = 400, ["chunk size 0x.."] = 400,
    ["chunk data without its CRLF"] = 400, ["last-chunk ending in LF"] = 400,
    ["trailer line ending in LF"] = 400, ["bare CR hiding a CL"] = 400,
    ["NUL in a field value"] = 400, ["LF-only head"] = 400,
}

local GET_P = "GET /p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

describe("request smuggling", function()
    local srv
    setup(function()
        srv = server.start { app = APP, tls = false }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)

    describe("direct: refused with one answer, then the close", function()
        for _, p in ipairs(PAYLOADS) do
            it(p[1], function()
                local want = assert(DIRECT[p[1]], "no expectation for " .. p[1])
                -- a victim's request right behind it on the same connection
                local data, closed = srv:raw(p[2] .. GET_P, { timeout = 5 })
                assert.are.equal(1, server.count_status_lines(data), data)
                local r = server.parse_responses(data)[1]
                assert.truthy(r, data)
                assert.are.equal(want, r.status, data)
                assert.is_true(closed, "the connection stayed open after " .. p[1])
                assert.falsy(data:find("SMUGGLED", 1, true), data)
            end)
        end
    end)

    describe("direct: accepted forms are read strictly", function()
        -- each is followed by GET /p: exactly two answers, the second "p:/p"
        local cases = {
            { "OWS is a tab", H .. "Transfer-Encoding:\tchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "echo:abc" },
            { "empty list elements around chunked (RFC 9110 §5.6.1)",
                H .. "Transfer-Encoding: , chunked,\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "echo:abc" },
            { "a Content-Length field in the trailers is dropped",
                H .. "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nContent-Length: 40\r\n\r\n", "echo:abc" },
            { "a Content-Length on GET is a body", ("GET /p HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"):format(L) .. SMUG, "p:/p" },
            { "16 hex digits of leading zeros", H .. "Transfer-Encoding: chunked\r\n\r\n0000000000000003\r\nabc\r\n0\r\n\r\n", "echo:abc" },
            { "Transfer_Encoding is another field", H .. "Transfer_Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", "echo:abc" },
        }
        for _, cs in ipairs(cases) do
            it(cs[1], function()
                local data = srv:raw(cs[2] .. GET_P, { timeout = 5 })
                local list = server.parse_responses(data)
                assert.are.equal(2, #list, data)
                assert.are.equal(200, list[1].status, data)
                assert.are.equal(cs[3], list[1].body)
                assert.are.equal("p:/p", list[2].body)
                assert.falsy(data:find("SMUGGLED", 1, true), data)
            end)
        end
    end)

    describe("HEAD", function()
        -- RFC 9110 §9.3.2: no answer to HEAD has content; a body there desyncs any client or
        -- proxy that reads the next answer on the connection right after the header section.
        local cases = {
            { "417 (the engine's reply before any stream)", "HEAD /p HTTP/1.1\r\nHost: x\r\nExpect: x\r\n\r\n", 417 },
            { "400 for a bad field", "HEAD /p HTTP/1.1\r\nHost: x\r\nX: a\1b\r\n\r\n", 400 },
            { "431 for too many fields", "HEAD /p HTTP/1.1\r\nHost: x\r\n" .. ("X: y\r\n"):rep(120) .. "\r\n", 431 },
            { "505", "HEAD /p HTTP/2.0\r\nHost: x\r\n\r\n", 505 },
            { "501 for an unknown coding", "HEAD /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501 },
            { "413", "HEAD /p HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", 413 },
        }
        for _, cs in ipairs(cases) do
            it("answers " .. cs[1] .. " without content", function()
                local data, closed = srv:raw(cs[2], { timeout = 5 })
                local head, rest = data:match("^(.-\r\n\r\n)(.*)$")
                assert.truthy(head, data)
                assert.truthy(head:match("^HTTP/1%.1 " .. cs[3] .. " "), data)
                assert.are.equal("", rest, "content after the head of a HEAD answer")
                assert.is_true(closed)
            end)
        end

        it("answers router errors to HEAD on a kept-alive connection without content", function()
            local data = srv:raw("HEAD /a/%zz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                .. "HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n" .. GET_P, { timeout = 5 })
            local list = server.parse_responses(data, { head = { true, true, true } })
            assert.are.equal(4, #list, data)
            assert.are.same({ 400, 405, 404, 200 }, { list[1].status, list[2].status, list[3].status, list[4].status })
            assert.are.equal("p:/p", list[4].body)
        end)
    end)

    it("logged no [error] line for any of that", function()
        assert.are.same({}, srv:unexpected_errors())
    end)
end)

describe("a bad request line", function()
    -- answered at its CRLF, not held until a blank line (an HTTP/0.9 client never sends one) or
    -- the header timeout (set long here, so a 408 cannot pass for the answer)
    local srv
    setup(function()
        srv = server.start { app = APP, tls = false, args = { "--limit", "header_timeout_ms=120000" } }
    end)
    teardown(function()
        if srv then srv:stop() end
    end)
    local cases = {
        { "an HTTP/0.9 request line", "GET /p\r\n", 400 },
        { "a version with a trailing space", "GET /p HTTP/1.1 \r\n", 400 },
        { "HTTP/1.10", "GET /p HTTP/1.10\r\n", 400 },
        { "HTTP/2.0", "GET /p HTTP/2.0\r\n", 505 },
        { "a CTL in the target, a field line after", "GET /\1 HTTP/1.1\r\nHost: x\r\n", 400 },
        { "two spaces after the method", "GET  /p HTTP/1.1\r\n", 400 },
    }
    for _, cs in ipairs(cases) do
        it("is answered at once: " .. cs[1], function()
            local c = assert(srv:raw_conn())
            c:send(cs[2])
            local r, err = c:read_response({ timeout = 30 })
            assert.truthy(r, tostring(err))
            assert.are.equal(cs[3], r.status)
            assert.is_true(c:wait_closed(10))
            c:close()
        end)
    end
end)

describe("behind nginx", function()
    local srv, ngx
    setup(function()
        srv = server.start { app = APP, tls = false }
        -- ports[1]: raw URI to a keep-alive pool; ports[2]: proxy_pass with a URI part (nginx
        -- sends its own normal form, re-encoded)
        ngx = nginx.start(function(ports)
            local k = "127.0.0.1:" .. srv.port
            return table.concat({
                "  upstream kh { server " .. k .. "; keepalive 4; }",
                "  server { listen 127.0.0.1:" .. ports[1] .. ";",
                "    location /admin/ { return 403; }",
                "    location / { proxy_pass http://kh; proxy_http_version 1.1;",
                "                 proxy_set_header Connection \"\"; } }",
                "  server { listen 127.0.0.1:" .. ports[2] .. ";",
                "    location /admin/ { return 403; }",
                "    location / { proxy_pass http://kh/; proxy_http_version 1.1;",
                "                 proxy_set_header Connection \"\"; } }",
            }, "\n")
        end, 2)
    end)
    teardown(function()
        nginx.stop(ngx)
        if srv then srv:stop() end
    end)

    -- The first answer (nginx may keep the client connection open for a pipelined rest).
    local function send(port, bytes)
        local c = assert(server.connect("127.0.0.1", port))
        c:send(bytes)
        local r, err = c:read_response({ timeout = 10 })
        c:close()
        return r and r.raw or ("no answer: " .. tostring(err))
    end

    it("no payload poisons the upstream connection for the next client", function()
        for _, p in ipairs(PAYLOADS) do
            local data = send(ngx.port, p[2])
            assert.falsy(data:find("SMUGGLED", 1, true), p[1] .. ": " .. data)
            for _ = 1, 3 do
                local v = server.parse_responses(send(ngx.port, GET_P))[1]
                assert.truthy(v, p[1] .. ": no answer for a victim")
                assert.are.equal(200, v.status, p[1])
                assert.are.equal("p:/p", v.body, p[1] .. ": a victim got someone else's answer")
            end
        end
    end)

    it("no path payload reaches the /admin route, with or without a URI part in proxy_pass", function()
        local payloads = {
            "/public/%252e%252e/admin/x", "/public/%25%32%65%25%32%65/admin/x", "/public/%u002e%u002e/admin/x",
            "/public/%2E%2e/admin/x", "/admin;/x", "/admin/..;/public/x", "/public/..;/admin/x",
            "/admin./x", "/public/%EF%BC%8E%EF%BC%8E/admin/x", "/public/%C0%AE%C0%AE/admin/x",
            "/public/%E0%80%AE%E0%80%AE/admin/x", "/public/..%2fadmin/x", "/public/%2e%2e%2fadmin/x",
            "/public/%2e%2e%5cadmin/x", "/public/%2e%2e/%61dmin/x", "/%2561dmin/x", "/ad%6din/x",
            "/public/..%00/admin/x", "/public/x%2F%2E%2E%2F%2E%2E%2Fadmin/x", "/public/.%2e/admin/x",
            "/public/...//admin/x", "/public/%2e%2e%2e/admin/x", "/ADMIN/x", "/public/x%3F/../../admin/x",
            "/public/x%23/../../admin/x", "/public/x;/../../admin/x", "/admin/x/..", "/public/x/../../admin/x",
            "/public/%2e%2e/%2e%2e/admin/x", "//admin/x", "/public/..//admin/x",
        }
        for _, port in ipairs(ngx.ports) do
            for _, t in ipairs(payloads) do
                local data = send(port, "GET " .. t .. " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                local r = server.parse_responses(data)[1]
                assert.truthy(r, t .. ": " .. data)
                assert.falsy(r.body:find("ADMIN", 1, true), port .. " " .. t .. " reached /admin/*rest: " .. r.body)
                assert.truthy(r.status == 200 or r.status == 400 or r.status == 403 or r.status == 404,
                    t .. " -> " .. r.status)
            end
        end
    end)

    it("logged no [error] line", function()
        assert.are.same({}, srv:unexpected_errors())
    end)
end)
