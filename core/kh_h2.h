/* kh_h2.h: HTTP/2 on a kh_conn (RFC 9113) with nghttp2's server session (mem_recv/mem_send).
 * Entry points: prior knowledge (kh_h1 sees the connection preface and calls kh_h2_start), the
 * HTTP/1.1 Upgrade to h2c (kh_h2_upgrade), and ALPN "h2" over TLS (kh_h2_start on a fresh
 * connection). Each request stream is a kh_stream with the h2 sink; Lua sees no difference. */
#ifndef KH_H2_H
#define KH_H2_H

#include "kh_conn.h"

extern const kh_proto_vt kh_h2_proto;

/* The HTTP/2 connection preface a client sends first (RFC 9113 §3.4). */
#define KH_H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define KH_H2_PREFACE_LEN 24

/* Switches c to HTTP/2: allocates the session (pointer in c->proto_inline), queues the server
 * SETTINGS and sets c->proto. Works with no byte received yet (ALPN) or with the client preface
 * about to be fed (prior knowledge). */
void kh_h2_start(kh_conn *c);

/* HTTP/1.1 Upgrade: h2c (RFC 7540 §3.2; deprecated by RFC 9113 §3.1 but still sent by curl).
 * s is the upgrading request, already set up by kh_h1 with no body; it becomes stream 1.
 * settings is the HTTP2-Settings header value (base64url). On success the 101 is queued, c
 * speaks h2 and 0 is returned; otherwise nothing was changed and the request stays HTTP/1.1. */
int kh_h2_upgrade(kh_conn *c, kh_stream *s, kh_str settings);

#endif
