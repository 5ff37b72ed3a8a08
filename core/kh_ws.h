/* kh_ws.h: sans-io RFC 6455 codec for the server side of a WebSocket: a frame parser, a session
 * that turns frames into messages (fragmentation, control frames between fragments, UTF-8 of text
 * checked incrementally, permessage-deflate inflation, size limits, the close handshake, automatic
 * pong), and the encoder of server frames. It sees nothing but bytes: the handshake (101 on h1,
 * 200 to an extended CONNECT on h2) is done before it, by the protocol (kh_ws_handshake.h), and the
 * transport is whatever carries the tunnel (a kh_stream).
 * Owns:  a session's message block (malloc: the bytes of a message split across frames or inputs
 *        with their length and room, at most max_message bytes, freed after each message;
 *        a message that arrives whole in one unfragmented, uncompressed frame is delivered from the
 *        input itself, with no copy) and a 125-byte control-frame buffer, malloc'd only while a
 *        control frame split across inputs is assembled (a whole one is read from the input):
 *        an idle session holds no buffer (memory per idle WebSocket, bench/README.md).
 * In:    kh_ws_conn_feed(bytes): the caller's buffer, unmasked in place and consumed by offset
 *        (no memmove per frame); partial frames are kept as parser state, never as bytes.
 * Out:   kh_ws_cbs callbacks (shared by all sessions through a kh_ws_cfg, with the limits):
 *        message, send (one frame: header + payload, to be copied), pong.
 * Never: does I/O, keeps a clock (the idle timeout belongs to the caller), or calls back into the
 *        session from a callback. */
#ifndef KH_WS_H
#define KH_WS_H

#include <stddef.h>
#include <stdint.h>

enum {
    KH_WS_OP_CONT = 0x0,
    KH_WS_OP_TEXT = 0x1,
    KH_WS_OP_BINARY = 0x2,
    KH_WS_OP_CLOSE = 0x8,
    KH_WS_OP_PING = 0x9,
    KH_WS_OP_PONG = 0xA,
};

/* close codes (RFC 6455 §7.4.1) that the codec sends itself */
enum {
    KH_WS_CLOSE_NORMAL = 1000,
    KH_WS_CLOSE_GOING_AWAY = 1001,
    KH_WS_CLOSE_PROTOCOL = 1002,
    KH_WS_CLOSE_NO_STATUS = 1005, /* received a close frame without a code (never sent) */
    KH_WS_CLOSE_ABNORMAL = 1006,  /* the transport ended with no close frame (never sent) */
    KH_WS_CLOSE_INVALID_DATA = 1007,
    KH_WS_CLOSE_POLICY = 1008,
    KH_WS_CLOSE_TOO_BIG = 1009,
    KH_WS_CLOSE_INTERNAL = 1011,
};

/* ---- frame parser ---- */

typedef struct kh_ws_parser {
    uint64_t left;       /* payload bytes of the current frame still to come */
    uint8_t hdr[14];     /* a frame header split across inputs */
    uint8_t hdr_fill;
    uint8_t mask[4];
    uint8_t mask_off;    /* where the key stands for the next payload byte (0..3) */
    uint8_t opcode, fin, rsv1, first;
    uint8_t in_payload;  /* a header has been read; payload follows */
    uint8_t in_message;  /* a fragmented data message has started and not finished */
    uint8_t rsv1_ok;     /* permessage-deflate was negotiated: RSV1 may be set on a first frame */
} kh_ws_parser;

typedef struct kh_ws_chunk {
    uint8_t *data;       /* unmasked payload bytes (in the caller's buffer) */
    size_t len;
    uint8_t opcode;      /* the frame's opcode (0 for a continuation) */
    uint8_t fin, rsv1;
    uint8_t frame_first; /* the first chunk of this frame */
    uint8_t frame_end;   /* the last chunk of this frame */
} kh_ws_chunk;

void kh_ws_parser_init(kh_ws_parser *p, int rsv1_ok);
/* Parses from buf[0..n); a frame whose payload is over max_frame bytes is refused (1009). Returns 1 with *c set (a piece of one frame's payload, possibly empty),
 * 0 when all n bytes were consumed with no chunk to give, or a negative close code (-1002,
 * -1009) when the input breaks RFC 6455; *used is the count of bytes consumed in every case.
 * Unmasks the payload in place. */
int kh_ws_parse(kh_ws_parser *p, uint64_t max_frame, uint8_t *buf, size_t n, size_t *used,
                kh_ws_chunk *c);

/* ---- encoder ---- */

#define KH_WS_HDR_MAX 10
/* Writes a server frame header (never masked) to hdr; returns its length (2, 4 or 10). */
size_t kh_ws_frame_header(uint8_t hdr[KH_WS_HDR_MAX], int opcode, int fin, int rsv1, uint64_t len);

/* ---- helpers ---- */

/* 1 when a close frame may carry code (RFC 6455 §7.4, IANA registry: 1000-1003, 1007-1014,
 * 3000-4999); 1004-1006, 1015 and the rest are refused. */
int kh_ws_close_code_ok(unsigned code);
/* Incremental UTF-8 check (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF).
 * *state starts at 0 and carries a sequence split between calls. Returns 0 while valid, -1 at
 * the first invalid byte. The text is complete and valid when it returns 0 with *state == 0. */
int kh_ws_utf8(uint32_t *state, const uint8_t *p, size_t n);

/* ---- session ---- */

typedef struct kh_ws_conn kh_ws_conn;

/* The callbacks get the session; the caller embeds it in its own per-socket state and finds
 * that with KH_CONTAINER_OF (no user pointer per session: memory per idle WebSocket). */
typedef struct kh_ws_cbs {
    /* A whole message (text is valid UTF-8, compressed ones inflated); p lives only during the
     * call. Return 0 to go on, 1 to pause: kh_ws_conn_feed returns KH_WS_PAUSED right after it. */
    int (*message)(kh_ws_conn *w, int binary, const uint8_t *p, size_t n);
    /* One frame to send: the header, then the payload. The callee copies both. */
    void (*send)(kh_ws_conn *w, const uint8_t *hdr, size_t hlen, const uint8_t *p, size_t n);
    /* A pong arrived (may be NULL). */
    void (*pong)(kh_ws_conn *w, const uint8_t *p, size_t n);
    /* Inflates a compressed message (permessage-deflate, kh_ws_deflate.h); NULL when not
     * negotiated. Returns 0 with *out (malloc'd, freed by the session) or a close code. */
    int (*inflate)(kh_ws_conn *w, const uint8_t *in, size_t n, uint64_t max, uint8_t **out,
                   size_t *outlen);
} kh_ws_cbs;

/* What the sessions of one owner share (the Lua binding: one per worker, in its per-worker
 * state): the callbacks and the limits. It outlives every session that points to it. */
typedef struct kh_ws_cfg {
    kh_ws_cbs cb;
    uint64_t max_message; /* bytes of one message, assembled or inflated (1009 above) */
    uint64_t max_frame;   /* payload bytes of one frame (1009 above) */
} kh_ws_cfg;

enum { KH_WS_OK = 0, KH_WS_PAUSED = 1, KH_WS_CLOSED = 2 };

/* 80 bytes: an idle WebSocket keeps one inside its ws object (lua/kh_lua_ws.c), so what only
 * a message split across inputs needs (its bytes, their length and room) is one pointer to a
 * block that exists while such a message is assembled, and the split control frame's 125
 * bytes another (was 120 bytes with the limits, callbacks, user pointer and the message's
 * length and room inline; bench/README.md "Memory per idle WebSocket"). */
struct kh_ws_conn {
    kh_ws_parser p;
    const kh_ws_cfg *cfg;
    struct kh_ws_msg *msg; /* the message being assembled (NULL between messages) */
    uint8_t *ctl;         /* 125 bytes while a split control frame is assembled, else NULL */
    uint32_t utf8;        /* kh_ws_utf8 state of the text message being assembled */
    uint8_t msg_op;       /* KH_WS_OP_TEXT/BINARY while a message is open, else 0 */
    uint8_t msg_deflated; /* its first frame had RSV1 */
    uint8_t ctl_len;
    uint8_t close_sent, close_received, closed;
    uint16_t close_code;  /* the peer's code (1005 when none), or the code we failed with */
};

/* cfg (callbacks, limits) is shared and must outlive the session. */
void kh_ws_conn_init(kh_ws_conn *w, const kh_ws_cfg *cfg, int deflate);
/* Feeds received bytes (unmasked in place). Returns KH_WS_OK (all consumed), KH_WS_PAUSED (the
 * message callback asked to pause; *used bytes consumed, call again with the rest), or
 * KH_WS_CLOSED: the close handshake is done or the peer broke the protocol (the close frame
 * was sent through cb.send; close_code says why); the caller closes the transport once the
 * frame is written. Bytes after a close frame are ignored. */
int kh_ws_conn_feed(kh_ws_conn *w, uint8_t *buf, size_t n, size_t *used);
/* Starts the close handshake from our side: sends a close frame with code (0: none) and reason
 * (cut to 123 bytes on a UTF-8 boundary). Data frames that still arrive are dropped; the
 * session reports KH_WS_CLOSED when the peer's close frame comes back. No-op once sent. */
void kh_ws_conn_close(kh_ws_conn *w, unsigned code, const char *reason, size_t n);
/* Frees the message and control buffers. */
void kh_ws_conn_free(kh_ws_conn *w);

#endif
