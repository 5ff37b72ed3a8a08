/* kh_limits.h: every limit of the engine in one X-macro table (style.md "Limits: one table").
 * Owns:  the table; struct kh_limits is a plain value copied into each worker at start.
 * In:    defaults, then --limit name=value / --name-with-dashes value (precedence: default < CLI).
 * Out:   range-checked values, the --print-limits table. */
#ifndef KH_LIMITS_H
#define KH_LIMITS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* X(name, default, min, max, doc) */
#define KH_LIMITS(X)                                                                               \
    X(header_bytes, 16384, 256, 1048576, "max bytes of a request head (431)")                     \
    X(header_fields, 100, 4, 10000, "max header fields in a request (431)")                        \
    X(target_bytes, 8192, 64, 1048576, "max bytes of a request-target (414)")                      \
    X(body_bytes, 8388608, 0, 1099511627776ULL, "max buffered request body (413)")                 \
    X(header_timeout_ms, 10000, 50, 3600000, "time to receive a complete request head (408)")      \
    X(body_timeout_ms, 60000, 50, 3600000, "max gap between two reads of a request body")          \
    X(keepalive_timeout_ms, 60000, 0, 3600000, "idle keep-alive connection lifetime (0: no keep-alive)") \
    X(write_timeout_ms, 30000, 50, 3600000, "max time a response write may stall")                 \
    X(h1_out_high_water, 262144, 16384, 67108864, "HTTP/1.1 bytes queued for the socket before the next pipelined request waits") \
    X(connections, 100000, 1, 10000000, "open connections per worker (then idle keep-alive ones make room, or it stops accepting)") \
    X(accept_backoff_ms, 100, 1, 60000, "out of file descriptors (EMFILE/ENFILE): stop accepting this long or until a connection closes") \
    X(defer_accept_s, 1, 0, 3600, "TCP_DEFER_ACCEPT: the kernel hands a new connection over once its first bytes are in, or after about this many s (0: off)") \
    X(lua_coroutine_cache, 1024, 0, 1000000, "finished coroutines kept for reuse per worker")     \
    X(lingering_close_ms, 2000, 0, 60000, "how long to drain input after an error reply before closing") \
    X(h2_max_concurrent_streams, 100, 1, 100000, "HTTP/2 streams a peer may open at once (SETTINGS)") \
    X(h2_stream_window, 262144, 65535, 2147483647, "HTTP/2 receive window per stream (bytes)")    \
    X(h2_conn_window, 1048576, 65535, 2147483647, "HTTP/2 receive window per connection (bytes)") \
    X(h2_out_high_water, 131072, 16384, 67108864, "HTTP/2 bytes queued for the socket before output and input pause") \
    X(h2_max_continuations, 8, 0, 1024, "HTTP/2 CONTINUATION frames after one HEADERS frame")   \
    X(h2_flood_frames, 1000, 10, 1000000, "HTTP/2 PING/SETTINGS/PRIORITY/empty DATA frames per second (then GOAWAY)") \
    X(h2_peer_resets, 200, 1, 1000000, "HTTP/2 RST_STREAM frames a peer may send per second (then GOAWAY)") \
    X(h2c_upgrade, 0, 0, 1, "1: accept Upgrade: h2c (RFC 7540 3.2; removed by RFC 9113)")          \
    X(pool_threads, 0, 0, 1024, "k.blocking pool threads (0: one per core)")                      \
    X(pool_queue, 64, 1, 65536, "queued k.blocking jobs per pool thread (then 503)")              \
    X(pool_msg_bytes, 8388608, 64, 1073741824, "max bytes of copied k.blocking/publish values")   \
    X(slice_warn_ms, 20, 0, 600000, "log a Lua slice that runs longer (0: off)")                  \
    X(defer_timeout_ms, 60000, 1, 86400000, "default res:defer() timeout (then 504)")             \
    X(stall_report_ms, 1000, 100, 3600000, "report a worker loop stalled this long")              \
    X(stall_shed_ms, 500, 50, 3600000, "a worker stalled this long gets no new connections until it runs again (the others take them)") \
    X(stall_exit_ms, 0, 0, 86400000, "exit with code 4 when a worker stays stalled this long, for a process manager to restart (0: off)") \
    X(handler_interrupt_ms, 0, 0, 86400000, "raise an error in Lua code running this long without yielding: 500 (0: off; interpreted code only)") \
    X(tls_handshake_timeout_ms, 10000, 50, 3600000, "time for a TLS handshake to complete")       \
    X(tls_ticket_rotate_s, 3600, 1, 604800, "a session-ticket key encrypts this long, decrypts as long again") \
    X(tls_own_records, 1, 0, 1, "1: khamsin protects TLS 1.3 records after the handshake; 0: OpenSSL does (~11 KB more per connection)") \
    X(hsts_max_age, 31536000, 0, 4294967295ULL, "Strict-Transport-Security max-age (s) added over TLS (0: none)") \
    X(tls_nosniff, 1, 0, 1, "add X-Content-Type-Options: nosniff over TLS (0: no)")             \
    X(request_id_header, 1, 0, 2, "X-Request-Id on replies: 1 a client's own id echoed, and the id on every 5xx; 2 on every reply (an id made here when the client sent none); 0 never (req.id and the logs keep it)") \
    X(compress, 0, 0, 1, "1: compress responses by Accept-Encoding (zstd, br, gzip); off by default (BREACH, CPU)") \
    X(compress_min_bytes, 1024, 0, 1073741824, "smallest body compressed (streamed bodies always are)") \
    X(compress_gzip_level, 5, 1, 9, "gzip level (zlib)")                                          \
    X(compress_br_level, 4, 0, 11, "br quality (libbrotlienc)")                                   \
    X(compress_zstd_level, 3, 1, 19, "zstd level (libzstd)")                                      \
    X(form_fields, 1000, 1, 10000000, "max fields in a req:form() body (400)")                    \
    X(multipart_parts, 100, 1, 10000000, "max parts in a req:multipart() body (400)")             \
    X(multipart_header_bytes, 8192, 64, 1048576, "max bytes of one multipart part's header block (400)") \
    X(multipart_part_bytes, 8388608, 1, 1099511627776ULL, "max bytes of one multipart part (400)") \
    X(h3_max_streams, 100, 1, 10000, "HTTP/3 request streams a peer may open at once (QUIC initial_max_streams_bidi)") \
    X(h3_retry_above, 1000, 0, 10000000, "connections open on a worker above which a new QUIC client must first prove its address with a Retry (0: always)") \
    X(h3_gso, 1, 0, 1, "1: send several QUIC packets of a connection in one sendmsg (UDP_SEGMENT) where the kernel can") \
    X(h3_recv_batch, 10, 1, 20, "QUIC datagrams read per recvmmsg call (1: one recvmsg each)") \
    X(outbound_sockets, 1024, 1, 1000000, "open outbound sockets (k.socket) per worker, idle pooled ones included (then the oldest idle one closes, or connect fails)") \
    X(outbound_pool, 256, 0, 1000000, "idle keep-alive outbound sockets per worker (then the oldest closes)") \
    X(socket_pool_size, 30, 1, 100000, "default pool size per host and port for sock:setkeepalive()") \
    X(socket_keepalive_ms, 60000, 0, 86400000, "default idle time of a pooled outbound socket (0: no limit)") \
    X(socket_connect_timeout_ms, 60000, 1, 86400000, "default k.socket connect timeout (resolve, connect, TLS handshake)") \
    X(socket_send_timeout_ms, 60000, 1, 86400000, "default k.socket send timeout") \
    X(socket_read_timeout_ms, 60000, 1, 86400000, "default k.socket receive timeout") \
    X(socket_buffer_bytes, 16777216, 1024, 1099511627776ULL, "max bytes one k.socket receive may buffer") \
    X(dns_cache_ms, 10000, 0, 3600000, "how long a worker reuses a resolved host name (0: no cache)") \
    X(http_client_header_bytes, 16384, 256, 1048576, "max bytes of a k.http response head") \
    X(http_client_header_fields, 100, 4, 10000, "max header fields in a k.http response head") \
    X(http_client_body_bytes, 8388608, 0, 1099511627776ULL, "default max_body of a k.http response (after decoding)") \
    X(http_client_timeout_ms, 60000, 1, 86400000, "default timeout of a whole k.http request (redirects included)") \
    X(http_client_redirects, 5, 0, 100, "default number of redirects k.http follows") \
    X(stream_high_water, 65536, 1024, 67108864, "bytes a streamed response (res:write, SSE) may queue before the writer waits (resumes at half)") \
    X(body_window, 262144, 1024, 67108864, "bytes of an incremental request body (req:body_reader, tunnels) buffered before reading pauses") \
    X(sse_keepalive_ms, 15000, 0, 3600000, "SSE keep-alive comment after this long without an event (0: off)") \
    X(stream_out_cap, 1048576, 1024, 1073741824, "bytes k.send_to may queue on a stream before the slow consumer is ended") \
    X(tunnel_idle_timeout_ms, 600000, 50, 86400000, "an upgraded stream (tunnel) with no byte either way this long is closed") \
    X(ws_message_bytes, 1048576, 125, 1073741824, "max bytes of a WebSocket message, after inflation (close 1009)") \
    X(ws_frame_bytes, 1048576, 125, 1073741824, "max payload bytes of one WebSocket frame (close 1009)") \
    X(ws_queue, 16, 1, 65536, "WebSocket messages decoded ahead of the message handler before reading pauses") \
    X(ws_deflate, 1, 0, 1, "1: accept permessage-deflate (RFC 7692, no context takeover either way)") \
    X(ws_close_timeout_ms, 5000, 50, 600000, "after our close frame, wait this long for the peer's before dropping the connection")

typedef struct kh_limits {
#define KH_LIMIT_FIELD(name, def, min, max, doc) uint64_t name;
    KH_LIMITS(KH_LIMIT_FIELD)
#undef KH_LIMIT_FIELD
} kh_limits;

void kh_limits_init(kh_limits *l);
/* Sets one limit by name (underscores or dashes). Returns 0, or -1 with a message in err that
 * names the limit and its range. */
int kh_limits_set(kh_limits *l, const char *name, const char *value, char *err, size_t errlen);
/* 1 if name (underscores or dashes) is a limit. */
int kh_limits_is_name(const char *name);
void kh_limits_print(const kh_limits *l, FILE *out);

#endif
