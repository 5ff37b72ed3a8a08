/* kh_ws_handshake.h: the server's checks and answer for a WebSocket opening handshake (RFC 6455
 * §4.2), shared by the h1 upgrade (GET + Upgrade: websocket) and the h2 extended CONNECT
 * (RFC 8441, which has no key and no Accept).
 * Owns:  nothing.
 * Never: allocates or sees a connection. */
#ifndef KH_WS_HANDSHAKE_H
#define KH_WS_HANDSHAKE_H

#include <stddef.h>

#define KH_WS_ACCEPT_LEN 28

/* 1 when key is the base64 of 16 bytes (§4.2.1 item 5): 24 characters ending in "==". */
int kh_ws_key_ok(const char *key, size_t n);
/* Sec-WebSocket-Accept for key: base64(SHA-1(key + 258EAFA5-E914-47DA-95CA-C5AB0DC85B11)). */
void kh_ws_accept(const char *key, size_t n, char out[KH_WS_ACCEPT_LEN]);
/* 1 when a Sec-WebSocket-Version value is exactly "13" (§4.2.1 item 6; else 426 with
 * Sec-WebSocket-Version: 13). */
int kh_ws_version_ok(const char *v, size_t n);
/* 1 when the comma-separated list v holds token (case-insensitive), e.g. "websocket" in
 * Upgrade or "upgrade" in Connection. */
int kh_ws_has_token(const char *v, size_t n, const char *token);

#endif
