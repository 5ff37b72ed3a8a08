---@meta khamsin
-- library/khamsin.lua: LuaLS (lua-language-server) annotations for khamsin's Lua API, for
-- completion and type checks in editors. Never loaded by khamsin itself: point the editor at
-- this directory ("workspace.library", README "Editor support"). Installed with the rock in
-- <tree>/share/lua/5.1/khamsin/library/.
-- Layout (spec/meta_spec.lua parses it and compares it with the running module, both ways):
-- one `---@class` per object, bound to a `local NAME = {}` right after it; its functions as
-- `function NAME.f(...) end` / `function NAME:m(...) end`; its other members as `---@field`.
-- Keep that layout when adding a name.

---@alias khamsin.Status integer an HTTP status, 200-999 (a lone number returned is a status)
---@alias khamsin.Body string|number|table|nil a string is text/plain, a table JSON, a number text
---@alias khamsin.Headers table<string, string|string[]|false> a list repeats a header, false removes one

--- A route's handler: returns `body`, `status, body` or `status, body, headers`.
---@alias khamsin.Handler fun(req: khamsin.Request, res: khamsin.Response): (khamsin.Status|khamsin.Body)?, khamsin.Body?, khamsin.Headers?

---@class khamsin
---@field log khamsin.log the error log
---@field json khamsin.json JSON encoding and decoding
---@field socket khamsin.socket outbound TCP/TLS sockets that yield instead of blocking (luasocket's API)
---@field http khamsin.http an HTTP client (HTTP/1.1 keep-alive, HTTP/2 over TLS multiplexed across handlers, streamed request bodies) that yields instead of blocking
local k = {}

--- A GET route (it answers HEAD too). `:name` is one segment, a last `*name` the rest.
---@param path string
---@param handler khamsin.Handler
function k.get(path, handler) end

---@param path string
---@param handler khamsin.Handler
function k.post(path, handler) end

---@param path string
---@param handler khamsin.Handler
function k.put(path, handler) end

---@param path string
---@param handler khamsin.Handler
function k.patch(path, handler) end

---@param path string
---@param handler khamsin.Handler
function k.delete(path, handler) end

---@param path string
---@param handler khamsin.Handler
function k.options(path, handler) end

--- A route for every method.
---@param path string
---@param handler khamsin.Handler
function k.any(path, handler) end

--- A route for any method token (case-sensitive), e.g. `k.route("PURGE", "/cache/*key", fn)`.
---@param method string
---@param path string
---@param handler khamsin.Handler
function k.route(method, path, handler) end

--- Serves the files under `dir` at `prefix` (GET and HEAD): types, ETag/304, ranges, index,
--- precompressed siblings; a path never leaves `dir`. Declared while the script loads.
---@param prefix string
---@param dir string
---@param opts? {index: string|false|nil, follow_symlinks: boolean?, dotfiles: boolean?, precompressed: boolean?, max_bytes: integer?, cache_control: string?, cache: false|{valid: number?, entries: integer?, file_bytes: integer?, total_bytes: integer?}|nil}
function k.static(prefix, dir, opts) end

--- Raises an error that answers `status` with `message` (a table is sent as JSON); not logged.
---@param status khamsin.Status
---@param message? string|table
function k.fail(status, message) end

--- True for the error a wait raises once the request is over (client gone, 413/408 sent).
---@param err any
---@return boolean
function k.is_aborted(err) end

--- True for the error `k.blocking` raises when the pool's queue is full (503 if uncaught).
---@param err any
---@return boolean
function k.is_busy(err) end

--- This worker's number, 0 to `k.workers() - 1`.
---@return integer
function k.worker_id() end

--- The number of workers.
---@return integer
function k.workers() end

--- The loop's clock, in seconds.
---@return number
function k.now() end

--- Waits `seconds` without blocking the loop (`k.sleep(0)`: until the next loop turn).
---@param seconds number
function k.sleep(seconds) end

--- `fn()` once after `seconds`, in a coroutine of its own.
---@param seconds number
---@param fn fun()
---@return khamsin.Timer
function k.timer(seconds, fn) end

--- `fn()` every `seconds` (above 0), until `:cancel()`.
---@param seconds number
---@param fn fun()
---@return khamsin.Timer
function k.every(seconds, fn) end

--- Runs `fn(...)` on a pool thread (a function without upvalues, or "module.function") and
--- returns its results; arguments and results are copied.
---@param fn function|string
---@param ... any
---@return any ...
function k.blocking(fn, ...) end

--- Answers the deferred reply `id` (`d.id`) on whichever worker holds it.
---@param id string
---@param status? khamsin.Status|khamsin.Body
---@param body? khamsin.Body
---@param headers? khamsin.Headers
---@return boolean|nil ok
---@return string? err
function k.resolve(id, status, body, headers) end

--- A copy of `value` to every worker's `k.subscribe(topic, fn)`; returns the number of workers.
---@param topic string
---@param value any
---@return integer
function k.publish(topic, value) end

--- Writes to a push target from anywhere (another request, a timer, a pool result, another
--- worker): an SSE stream's `sse.id` (data: an event table or the data string) or a WebSocket's
--- `ws.id`. Never yields; a consumer with `stream_out_cap` bytes queued is ended, not buffered.
---@param id string
---@param data any
---@return true|nil ok
---@return string? err "closed", "gone" (no such stream any more), "no such worker"
function k.send_to(id, data) end

--- A WebSocket endpoint (RFC 6455 on HTTP/1.1 GET + Upgrade, RFC 8441 extended CONNECT on
--- HTTP/2: the same handlers). `open(ws, req)` runs in the request's coroutine after the
--- handshake; each message runs `message(ws, data, binary)` in a coroutine of its own, in order;
--- `close(ws, code)` runs once (code 1005: the peer sent none, 1006: no close frame at all).
--- `origin`: an allowed Origin, a list of them, or `fun(origin, req): boolean` (else 403);
--- `protocols`: the subprotocols offered back, by preference (the first the client lists wins).
---@param path string
---@param handlers {open: (fun(ws: khamsin.WebSocket, req: khamsin.Request))?, message: (fun(ws: khamsin.WebSocket, data: string, binary: boolean))?, close: (fun(ws: khamsin.WebSocket, code: integer))?, origin: (string|string[]|fun(origin: string?, req: khamsin.Request): boolean)?, protocols: string[]?}
function k.websocket(path, handlers) end

--- `fn(value, topic)` runs in a coroutine for each `k.publish(topic, value)`.
---@param topic string
---@param fn fun(value: any, topic: string)
---@return fun() unsubscribe
function k.subscribe(topic, fn) end

--- Declares a dictionary shared by every worker, with a byte budget (while the script loads).
---@param name string
---@param bytes integer
---@return khamsin.SharedDict
function k.shared_dict(name, bytes) end

--- The shared dictionary `name` (declared with `k.shared_dict`).
---@param name string
---@return khamsin.SharedDict
function k.shared(name) end

--- The app script's directory (absolute), for the app's own files.
---@return string
function k.app_dir() end

--- `value .. "." .. base64url(HMAC-SHA256(key, value))`; a key is at least 16 bytes.
---@param key string
---@param value string
---@return string
function k.sign(key, value) end

--- The value of a `k.sign`ed string, or nil when no key's signature matches (constant time).
---@param key string|string[] a key, or a list of keys while they rotate
---@param signed string?
---@return string?
function k.unsign(key, signed) end

--- Middleware for every request (under `prefix`), matched or not, in declaration order, before
--- the handler. `fn` answers (returns as a handler does), changes `res`, or `return next()`.
---@param prefix string|fun(req: khamsin.Request, res: khamsin.Response, next: fun(): any, ...): any
---@param fn? fun(req: khamsin.Request, res: khamsin.Response, next: fun(): any, ...): any
function k.use(prefix, fn) end

--- Replaces the engine's page for `status` (400-599, or "*"): `fn` returns as a handler does.
---@param status integer|"*"
---@param fn fun(req: khamsin.Request, res: khamsin.Response, err: {status: integer, message: any, traceback: string?}): any, any?, any?
function k.on_error(status, fn) end

--- A CORS middleware for `k.use`; preflights are answered 204 and never reach a handler.
---@param opts {origins: "*"|string[]|fun(origin: string, req: khamsin.Request): boolean, methods: string|string[]|nil, headers: string|string[]|nil, expose: string|string[]|nil, credentials: boolean?, max_age: integer?}
---@return fun(req: khamsin.Request, res: khamsin.Response, next: fun(): any): any
function k.cors(opts) end

---@class khamsin.log
local log = {}

---@param ... any
function log.err(...) end

---@param ... any
function log.warn(...) end

---@param ... any
function log.info(...) end

---@param ... any
function log.debug(...) end

---@class khamsin.json
---@field null lightuserdata JSON null (the same value as cjson.null)
local json = {}

--- Encodes `v`; raises at the caller's line, naming the value's path, for what cannot be sent.
---@param v any
---@return string
function json.encode(v) end

--- Decodes strict JSON; arrays come back marked (`[]` round-trips), null as `k.json.null`.
---@param s string
---@param max_depth? integer
---@return any value
---@return string? err
function json.decode(s, max_depth) end

--- Marks `t` as an array (`k.json.array({})` encodes `[]`); returns `t`.
---@generic T: table
---@param t T
---@return T
function json.array(t) end

--- True when `t` carries the array mark (`k.json.array`, or decoded from a JSON array).
---@param t any
---@return boolean
function json.is_array(t) end

---@class khamsin.Request
---@field method string
---@field path string the normal form the router matched
---@field query string? the raw query
---@field args table<string, string|string[]> the decoded query (a repeated key gives a list)
---@field params table<string, string> the route's `:name` and `*name` values, decoded
---@field headers table<string, string> lower-case names, any-case lookup
---@field version string "1.1" or "2"
---@field remote_addr string
---@field target string the request-target as sent
---@field authority string?
---@field scheme string "https" on a TLS connection, else "http"
---@field id string the request id (X-Request-Id)
---@field cookies table<string, string> the Cookie header, parsed
---@field route string? the matched route's pattern ("/users/:id"); nil when no route matched
local Request = {}

--- The whole body (waits for it).
---@return string
function Request:body() end

--- An iterator of the body's chunks as they arrive (under `body_window`); nil at the end. A route
--- declared with `{stream_body = true}` takes bodies past `body_bytes` this way.
---@return fun(): string?
function Request:body_reader() end

--- The body decoded as JSON (invalid JSON answers 400).
---@param max_depth? integer
---@return any
function Request:json(max_depth) end

--- An application/x-www-form-urlencoded body as a table (a repeated name gives a list); 400
--- for a malformed body or more than `max_fields` fields, 415 for another Content-Type.
---@param opts? {max_fields: integer?}
---@return table<string, string|string[]>
function Request:form(opts) end

--- A multipart/form-data body, read part by part (400 for a malformed body or past a limit).
---@param opts? {max_parts: integer?, max_header_bytes: integer?, max_part_bytes: integer?, max_total_bytes: integer?, files: "memory"|"disk"|nil, tmp_dir: string?}
---@return khamsin.Multipart
function Request:multipart(opts) end

---@class khamsin.Multipart
local Multipart = {}

--- The next part (after its headers; the rest of the current one is skipped), or nil.
---@return khamsin.Part?
function Multipart:part() end

--- `for part in reader:parts() do ... end`
---@return fun(): khamsin.Part?
function Multipart:parts() end

--- Every part: `{fields = {name = value}, files = {name = {filename, content_type, headers, size, data|path}}}`.
---@return {fields: table<string, string|string[]>, files: table<string, table>}
function Multipart:all() end

---@class khamsin.Part
---@field name string
---@field filename string?
---@field content_type string?
---@field headers table<string, string> lower-case names
local Part = {}

--- The part's next chunk of data, or nil at its end.
---@return string?
function Part:read() end

--- The part's remaining data as one string.
---@return string
function Part:data() end

---@class khamsin.Response
---@field status khamsin.Status default 200
---@field headers khamsin.Headers
local Response = {}

--- Keeps the request open after the handler returns; answer it with `d:send(...)`.
---@param opts? {timeout: number}
---@return khamsin.Deferred
function Response:defer(opts) end

--- Streams a chunk (the head goes first: `res.status`, `res.headers`, no length): chunked on
--- HTTP/1.1, DATA on HTTP/2. Waits while `stream_high_water` bytes are queued; nil, "closed"
--- once the client is gone. The handler returning ends the response.
---@param chunk string
---@return true|nil ok
---@return string? err
function Response:write(chunk) end

--- Ends a streamed response now.
---@return true|nil ok
---@return string? err
function Response:finish() end

--- Server-Sent Events: sends the text/event-stream head and returns the stream. `return sse`
--- from the handler keeps it open after the handler (for `k.send_to(sse.id, ...)`).
---@return khamsin.SSE
function Response:sse() end

--- Adds a Set-Cookie header.
---@param name string
---@param value string
---@param opts? {path: string?, domain: string?, max_age: integer?, expires: integer?, secure: boolean?, http_only: boolean?, same_site: "Strict"|"Lax"|"None"|nil}
function Response:set_cookie(name, value, opts) end

--- Sets Location and the status (302 by default); `return res:redirect(url)`.
---@param url string
---@param status? 300|301|302|303|307|308
---@return integer status
---@return nil
function Response:redirect(url, status) end

--- Sets ETag (`"value"`, or `W/"value"` when weak); 304 for a matching conditional GET/HEAD,
--- 412 at once for another method whose If-Match / If-None-Match fails.
---@param value string
---@param weak? boolean
---@return string etag
function Response:etag(value, weak) end

--- Sets Last-Modified from seconds since the epoch; 304 / 412 as for `res:etag`.
---@param time number
---@return integer
function Response:last_modified(time) end

---@class khamsin.Deferred
---@field id string "<worker>:<generation>:<n>", for `k.resolve`
local Deferred = {}

--- Answers the request (same forms as a handler's return values).
---@param status? khamsin.Status|khamsin.Body
---@param body? khamsin.Body
---@param headers? khamsin.Headers
---@return true|nil ok
---@return "timeout"|"closed"|nil err
function Deferred:send(status, body, headers) end

--- `fn()` runs if the client leaves first.
---@param fn fun()
function Deferred:on_abort(fn) end

--- Whether it still waits for its answer.
---@return boolean
function Deferred:pending() end

---@class khamsin.SharedDict
---@field name string
local SharedDict = {}

---@param key string
---@return string|number|boolean|nil
function SharedDict:get(key) end

---@param key string
---@param value string|number|boolean|nil nil deletes
---@param ttl? number seconds
---@return boolean ok
---@return string? err
---@return boolean? evicted
function SharedDict:set(key, value, ttl) end

--- Only when absent.
---@param key string
---@param value string|number|boolean
---@param ttl? number
---@return boolean ok
---@return string? err "exists"
function SharedDict:add(key, value, ttl) end

--- Only when present.
---@param key string
---@param value string|number|boolean
---@param ttl? number
---@return boolean ok
---@return string? err "not found"
function SharedDict:replace(key, value, ttl) end

---@param key string
---@param by? number default 1
---@param init? number
---@param ttl? number
---@return number? value
---@return string? err "not found" | "not a number"
function SharedDict:incr(key, by, init, ttl) end

---@param key string
function SharedDict:delete(key) end

--- Seconds left (0: never expires).
---@param key string
---@return number? ttl
---@return string? err "not found"
function SharedDict:ttl(key) end

---@param key string
---@param ttl? number 0 or nil: never expires
---@return boolean ok
---@return string? err "not found"
function SharedDict:expire(key, ttl) end

--- Live keys, most recently used first (0: all).
---@param max? integer default 1024
---@return string[]
function SharedDict:get_keys(max) end

function SharedDict:flush_all() end

---@return integer count
---@return integer bytes_used
---@return integer budget
function SharedDict:stats() end

---@class khamsin.socket
local socket = {}

--- A TCP socket (not connected) whose waits yield the coroutine. In handlers, timers and
--- subscribers only: raises while the script loads; refused in k.blocking pool threads.
---@return khamsin.Socket
function socket.tcp() end

--- This worker's outbound counters: open, idle, connects, reuses, evicted, dns_hits,
--- dns_lookups, max_open, max_idle.
---@return table
function socket.stats() end

--- A stand-in for luasocket's `socket` module (`package.loaded.socket = k.socket.luasocket()`):
--- tcp, connect, gettime, sleep, select (on several sockets at once: readable, writable, err),
--- dns, try/protect/newtry/skip.
---@param opts? table connect options every socket made through it gets ({pool_size=, backlog=})
---@return table
function socket.luasocket(opts) end

--- Resolves a host name without blocking (the worker's DNS cache first).
---@param host string
---@return string[]? ips
---@return string? err
function socket.resolve(host) end

--- Loads the TLS module and the CA store now (call it while the script loads), not in the
--- first TLS connection's slice (~50-150 ms once per process).
---@param opts? {cafile?: string, verify?: boolean}
---@return boolean? ok
---@return string? err
function socket.tls_preload(opts) end

---@class khamsin.http
local http = {}

--- An HTTP request whose waits yield the coroutine. url: http:// or https://. method: default
--- GET (POST with a body). body: a string, or streamed: a function giving chunks then nil
--- (req:body_reader() proxies an upload), or an object with such a read method; chunked on
--- HTTP/1.1 unless headers give its Content-Length, flow-controlled DATA on HTTP/2.
--- Concurrent requests of a worker to an HTTP/2 origin are streams of one shared connection.
--- timeout (s, default http_client_timeout_ms): the whole request,
--- redirects included; connect_timeout, read_timeout (s): each connect / each read.
--- max_body (bytes after decoding, default http_client_body_bytes); redirects (default
--- http_client_redirects, 0: none followed). stream = true: res.body is nil, read with
--- res:reader(). decode = false: no Accept-Encoding, no gzip/zstd decoding. verify (default
--- true), cafile: the TLS certificate check. http2 = false: HTTP/1.1 only over TLS.
--- h2c = true: HTTP/2 with prior knowledge on an http:// URL.
--- deny_private: refuse hosts that resolve to private/loopback addresses. pool_size (default
--- socket_pool_size): the origin's HTTP/1.1 pool; keepalive (idle seconds, default
--- socket_keepalive_ms): how long an idle pooled or HTTP/2 connection stays open.
--- Network and protocol failures return nil, reason ("timeout", "connection refused",
--- "closed mid-body", "tls: certificate verify failed: ...", "too many redirects", ...).
---@param opts {url: string, method?: string, headers?: table<string, string|string[]>, body?: string|(fun(): string?)|{read: fun(self): string?}, timeout?: number, connect_timeout?: number, read_timeout?: number, max_body?: integer, redirects?: integer, stream?: boolean, decode?: boolean, verify?: boolean, cafile?: string, http2?: boolean, h2c?: boolean, deny_private?: boolean, pool_size?: integer, keepalive?: number}
---@return khamsin.HttpResponse? res
---@return string? err
function http.request(opts) end

--- k.http.request with method GET and url.
---@param url string
---@param opts? table the options of k.http.request
---@return khamsin.HttpResponse? res
---@return string? err
function http.get(url, opts) end

---@class khamsin.HttpResponse
---@field status integer
---@field reason string the reason phrase ("" over HTTP/2)
---@field headers table<string, string> case-insensitive; repeated fields joined with ", "
---@field body string? nil with stream = true
---@field version string "1.1", "1.0" or "2"
---@field url string the URL that answered (after redirects)
---@field decoded string|false the Content-Encoding that was decoded, or false
local HttpResponse = {}

--- The body piece by piece: each call returns the next chunk, nil at the end, or nil, reason.
---@return fun(): string?, string?
function HttpResponse:reader() end

---@class khamsin.Socket
local Socket = {}

--- Connects (or takes a parked connection of the same host, port and options from the pool).
---@param host string
---@param port integer
---@param opts? {pool?: string, pool_size?: integer, backlog?: integer, deny_private?: boolean, tls?: table}
---@return integer? ok 1
---@return string? err "connection refused", "timeout", "host not found", ...
function Socket:connect(host, port, opts) end

--- TLS on the connected socket: verify (default true) against the system store or cafile,
--- server_name for SNI and the name check, alpn a list of protocols.
---@param opts {server_name?: string, verify?: boolean, cafile?: string, alpn?: string[]|string}
---@return integer? ok
---@return string? err "tls: certificate verify failed: ..."
function Socket:tls(opts) end

--- OpenResty's form of tls(); verify defaults to true here.
---@return boolean? ok
---@return string? err
function Socket:sslhandshake(reused_session, server_name, verify) end

--- The protocol ALPN chose, or nil.
---@return string?
function Socket:alpn() end

--- How many times this connection came from the pool (0: new).
---@return integer
function Socket:getreusedtimes() end

---@param data string|number|string[]
---@param i? integer
---@param j? integer
---@return integer? last index sent
---@return string? err
---@return integer? last index sent before the error
function Socket:send(data, i, j) end

--- "*l" (default: a line, CR/LF dropped), "*a" (until closed) or a byte count.
---@param pattern? string|integer
---@param prefix? string
---@return string? data
---@return string? err "closed", "timeout"
---@return string? partial what arrived before the error
function Socket:receive(pattern, prefix) end

--- Whatever has arrived: at least 1 byte, at most max.
---@param max integer
---@return string? data
---@return string? err
function Socket:receiveany(max) end

--- Seconds (nil or < 0: none), luasocket's unit. mode "b" (default): each operation; "t" (or
--- "r"): the whole call; a call waits at most the smaller of the two.
---@param seconds? number
---@param mode? "b"|"t"|"r"
function Socket:settimeout(seconds, mode) end

--- Milliseconds (OpenResty's unit); nil keeps one.
---@param connect_ms? number
---@param send_ms? number
---@param read_ms? number
function Socket:settimeouts(connect_ms, send_ms, read_ms) end

--- Parks the connection in the worker's pool (milliseconds; 0: no idle limit).
---@param idle_ms? number default socket_keepalive_ms
---@param pool_size? integer default socket_pool_size
---@return integer? ok
---@return string? err
function Socket:setkeepalive(idle_ms, pool_size) end

---@return integer ok
function Socket:close() end

--- Half-close: no more sends.
function Socket:shutdown() end

---@return string? ip
---@return integer|string port_or_err
function Socket:getpeername() end

--- "tcp-nodelay" or "keepalive".
---@param name string
---@param value boolean
function Socket:setoption(name, value) end

---@class khamsin.SSE
---@field id string the stream's id for k.send_to
---@field last_event_id string? the request's Last-Event-ID
local SSE = {}

--- Sends one event (multi-line data becomes several `data:` lines; CR/LF in event or id is an
--- error). In the handler's own coroutine it waits while `stream_high_water` bytes are queued.
---@param ev {event: string?, data: any, id: string?, retry: integer?}|string
---@return true|nil ok
---@return string? err "closed" once the client left or the stream ended
function SSE:send(ev) end

--- A comment line (`: text`), as the automatic keep-alive sends.
---@param text string?
---@return true|nil ok
---@return string? err
function SSE:comment(text) end

--- Ends the stream.
function SSE:close() end

--- `fn(sse, why)` runs once when the stream ends (the client left, :close(), slow consumer).
---@param fn fun(sse: khamsin.SSE, why: string)
function SSE:on_close(fn) end

--- A WebSocket (k.websocket). `ws:send` from the socket's own handlers waits while
--- `stream_high_water` bytes are queued; from anywhere else it never waits, and a socket with
--- `stream_out_cap` bytes queued is closed 1008. `ws:subscribe(topic)`: each
--- `k.publish(topic, string)` on any worker is sent to it.
---@class khamsin.WebSocket
---@field id string the socket's id for k.send_to
---@field protocol string? the subprotocol chosen
---@field req khamsin.Request the upgrade request
local WebSocket = {}

---@param data string
---@param binary boolean?
---@return true|nil ok
---@return string? err
function WebSocket:send(data, binary) end

---@param data string?
---@return true|nil ok
---@return string? err
function WebSocket:ping(data) end

--- Starts the close handshake (code 1000 by default).
---@param code integer?
---@param reason string?
---@return true
function WebSocket:close(code, reason) end

---@param topic string
function WebSocket:subscribe(topic) end

---@param topic string
function WebSocket:unsubscribe(topic) end

---@class khamsin.Timer
local Timer = {}

--- True if it was pending.
---@return boolean
function Timer:cancel() end

---@return boolean
function Timer:pending() end

return k
