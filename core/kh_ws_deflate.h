/* kh_ws_deflate.h: permessage-deflate (RFC 7692) for kh_ws: the negotiation of one
 * Sec-WebSocket-Extensions offer, and whole-message inflate/deflate on zlib raw streams.
 * We always answer with server_no_context_takeover and client_no_context_takeover (§7.1.1.1 and
 * §7.1.1.2 let the server add both even when the client did not offer them): every message is
 * then compressed on its own, so no socket keeps a 32 KiB window or a 256 KiB deflate state
 * while idle, and the caller can share one inflater and one deflater per worker (a message is
 * inflated or deflated in one call, never interleaved with another socket's).
 * Owns:  nothing; the z_streams are the caller's (kh_ws_deflate_init makes them).
 * Never: keeps context between messages (each call resets the stream first). */
#ifndef KH_WS_DEFLATE_H
#define KH_WS_DEFLATE_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

typedef struct kh_ws_pmd {
    int server_max_window_bits; /* 9..15: the window our deflater may use */
} kh_ws_pmd;

/* Picks the first acceptable offer in a Sec-WebSocket-Extensions value (offers separated by
 * ',', parameters by ';'; unknown or repeated parameters make an offer unacceptable, §7.1).
 * Returns the length of the response extension written to resp (NUL-terminated), or 0 when no
 * offer is acceptable (then the connection goes on without compression). An offer with
 * server_max_window_bits=8 is declined: zlib's raw deflate cannot use a 256-byte window. */
size_t kh_ws_pmd_negotiate(const char *v, size_t n, kh_ws_pmd *out, char *resp, size_t cap);

/* z_stream setup for a worker; windows of 15 bits inflate anything a client sends. */
int kh_ws_inflater_init(z_stream *z);
int kh_ws_deflater_init(z_stream *z, int window_bits);

/* Inflates one message (the bytes of its frames, with the 00 00 FF FF tail of §7.2.2 added).
 * Returns 0 with *out malloc'd (the caller frees it), KH_WS 1009 when the result passes max,
 * 1007 when the data is not a deflate stream. */
int kh_ws_inflate_msg(z_stream *z, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                      size_t *outlen);
/* Deflates one message and removes the 00 00 FF FF tail (§7.2.1). Returns 0 with *out
 * malloc'd, or -1 when memory runs out. */
int kh_ws_deflate_msg(z_stream *z, const uint8_t *in, size_t n, uint8_t **out, size_t *outlen);

#endif
