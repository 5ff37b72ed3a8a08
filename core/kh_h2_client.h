/* kh_h2_client.h: sans-io HTTP/2 client session on nghttp2 (the client-side twin of kh_h2.c):
 * requests multiplexed on one connection, each response's head and body collected per stream.
 * Owns:  the nghttp2 client session; per stream: a copy of the request body still to send (all of
 *        it, or for a streamed body the pieces written and not yet sent), the
 *        response head (status, fields in one buffer) and the body bytes not yet taken.
 * In:    bytes read from the connection (kh_h2c_recv); requests (kh_h2c_submit); the caller
 *        taking body bytes (kh_h2c_take), which is what opens the flow-control window again.
 * Out:   bytes to write (kh_h2c_send); per-stream state (kh_h2c_info); errors per stream (a
 *        RST_STREAM, a GOAWAY that excludes it, a limit) or for the whole session.
 * Never: touches a socket, a loop or Lua; lets a peer make it buffer more than the windows it
 *        granted (stream_window per stream, conn_window in all) plus the head limits. */
#ifndef KH_H2_CLIENT_H
#define KH_H2_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kh_common.h"
#include "kh_h1_parse.h"

/* Per-stream errors (kh_h2c_info.err) and session errors. */
enum {
    KH_H2C_ERESET = -5180,    /* the server reset the stream (RST_STREAM; code in h2_code) */
    KH_H2C_EGOAWAY = -5181,   /* the server's GOAWAY excluded the stream: safe to retry elsewhere */
    KH_H2C_EHEADLEN = -5182,  /* response head over header_bytes / header_fields */
    KH_H2C_EBODYLEN = -5183,  /* response body over body_bytes */
    KH_H2C_EPROTO = -5184,    /* the session failed (a protocol error by the server) */
    KH_H2C_ECLOSED = -5185,   /* the connection closed before the stream ended */
    KH_H2C_EREQ = -5186,      /* submit: bad request fields (nghttp2 refused them) */
    KH_H2C_ESTATUS = -5187,   /* response without a valid :status */
};

const char *kh_h2c_error_reason(int err);

typedef struct kh_h2c_limits {
    uint32_t stream_window; /* receive window per stream (SETTINGS_INITIAL_WINDOW_SIZE) */
    uint32_t conn_window;   /* receive window of the connection */
    size_t header_bytes;    /* names + values of one response head */
    size_t header_fields;
    uint64_t body_bytes;    /* per response */
} kh_h2c_limits;

typedef struct kh_h2c kh_h2c;

/* A new session; the connection preface and SETTINGS are queued for kh_h2c_send. */
kh_h2c *kh_h2c_new(const kh_h2c_limits *lim);
void kh_h2c_free(kh_h2c *s);

/* Queues a request: pseudo-headers from method/scheme/authority/path, then fields (names are
 * lower-cased; connection-specific ones such as Connection, Keep-Alive, Transfer-Encoding, Upgrade,
 * Host are dropped or refused as RFC 9113 §8.2.2 asks), then body (copied; NULL: no body, END_STREAM
 * on HEADERS). Returns the stream id (> 0), KH_H2C_EREQ, or KH_H2C_EGOAWAY when the server no
 * longer accepts streams (use another connection). */
int32_t kh_h2c_submit(kh_h2c *s, kh_str method, kh_str scheme, kh_str authority, kh_str path,
                      const kh_h1_field *fields, size_t num_fields, const char *body,
                      size_t body_len);

/* A request whose body comes in pieces (kh_h2c_write, until fin): DATA frames go out as the
 * server's flow-control windows allow, never more. content_length >= 0 is sent as the
 * content-length field (the caller then writes exactly that many bytes); -1: none. */
int32_t kh_h2c_submit_streamed(kh_h2c *s, kh_str method, kh_str scheme, kh_str authority,
                               kh_str path, const kh_h1_field *fields, size_t num_fields,
                               int64_t content_length);
/* Appends n body bytes (copied) to a streamed request; fin: the last piece. 0, KH_H2C_EREQ (not
 * a streamed request, or already finished), or the stream's / session's error. */
int kh_h2c_write(kh_h2c *s, int32_t id, const char *p, size_t n, int fin);
/* Body bytes written and not yet handed to nghttp2 (what the windows hold back): the caller
 * writes more only once this is low, so an upload never buffers more than it allows. */
size_t kh_h2c_unsent(kh_h2c *s, int32_t id);

/* Feeds bytes read from the connection. Returns 0, or KH_H2C_EPROTO when the session failed
 * (every open stream gets that error; GOAWAY is queued for kh_h2c_send). */
int kh_h2c_recv(kh_h2c *s, const uint8_t *p, size_t n);

/* The peer closed the connection: every stream not ended gets KH_H2C_ECLOSED. */
void kh_h2c_eof(kh_h2c *s);

/* Next bytes to write: *out valid until the next call into s. 0 when there is nothing. */
ssize_t kh_h2c_send(kh_h2c *s, const uint8_t **out);

typedef struct kh_h2c_info {
    int known;        /* 0: no such stream (never submitted, or forgotten) */
    int status;       /* 0 until the final head arrived */
    size_t num_fields;
    size_t body_len;  /* body bytes buffered, not yet taken */
    uint64_t body_total;
    int done;         /* END_STREAM received (and nothing went wrong) */
    int err;          /* 0 or a KH_H2C_E* code */
    uint32_t h2_code; /* the RST_STREAM / GOAWAY error code for KH_H2C_ERESET / EGOAWAY */
} kh_h2c_info;

void kh_h2c_info_get(kh_h2c *s, int32_t id, kh_h2c_info *info);
/* Field i of a stream's final head (lower-case name); valid until kh_h2c_forget(id). */
int kh_h2c_field(kh_h2c *s, int32_t id, size_t i, kh_str *name, kh_str *value);
/* Takes the buffered body bytes (valid until the next call into s) and gives the window back to
 * the server. Returns their count. */
size_t kh_h2c_take(kh_h2c *s, int32_t id, const char **p);
/* The caller is done with a stream: resets it if still open (CANCEL) and frees its state. */
void kh_h2c_forget(kh_h2c *s, int32_t id);

/* 1 while a new request may be submitted (no GOAWAY, no failure, under the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS). */
int kh_h2c_can_submit(kh_h2c *s);
/* Streams submitted and not forgotten. */
size_t kh_h2c_streams(kh_h2c *s);
/* 1 when the session wants nothing more (failed, or GOAWAY received and nothing open). */
int kh_h2c_dead(kh_h2c *s);

#endif
