/* kh_h1_client.h: sans-io HTTP/1.1 client side: a response reader (status line, headers, framing,
 * body events) and a request serializer.
 * Owns:  nothing. The caller owns every buffer; head slices point into the caller's input.
 * In:    response bytes as they arrive (the caller drops the bytes the reader says it consumed),
 *        the end of the input (peer closed), limits; the parts of a request to serialize.
 * Out:   events (a final head, body data slices, the end of the response), KH_H1C_E* errors with
 *        a short reason each; whether the connection may be reused; request bytes.
 * Never: allocates, touches I/O, accepts framing another hop could read differently (CL with TE,
 *        differing Content-Lengths, a bad chunk size). */
#ifndef KH_H1_CLIENT_H
#define KH_H1_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kh_common.h"
#include "kh_err.h"
#include "kh_h1_parse.h"

/* Errors of a response; after any of them the connection must be closed. */
enum {
    KH_H1C_ESTATUS = -5160,   /* malformed status line */
    KH_H1C_EVERSION = -5161,  /* not HTTP/1.x */
    KH_H1C_EFIELD = -5162,    /* malformed header line (bad name, control byte, obs-fold, bare CR/LF) */
    KH_H1C_EHEADLEN = -5163,  /* head longer than header_bytes */
    KH_H1C_EFIELDS = -5164,   /* more than header_fields fields */
    KH_H1C_EFRAMING = -5165,  /* CL with TE, differing Content-Lengths, TE without chunked last */
    KH_H1C_EBADCL = -5166,    /* Content-Length not a decimal (or too large) */
    KH_H1C_ECHUNK = -5167,    /* bad chunk size / chunk framing / trailer */
    KH_H1C_EBODYLEN = -5168,  /* body longer than body_bytes */
    KH_H1C_EINTERIM = -5169,  /* more than KH_H1C_MAX_INTERIM 1xx responses, or a 101 */
    KH_H1C_EMIDHEAD = -5170,  /* peer closed inside the head */
    KH_H1C_EMIDBODY = -5171,  /* peer closed inside the body (Content-Length not reached, no last chunk) */
    KH_H1C_ENORESP = -5172,   /* peer closed before the first byte of a response */
    KH_H1C_EREQ = -5173,      /* serializer: bad method / target / header name or value */
};

/* Interim (1xx) responses skipped before a final one; more is an attack or a bug. */
#define KH_H1C_MAX_INTERIM 16

/* Short reason for a KH_H1C_E* code, e.g. "closed mid-body". Never NULL. */
const char *kh_h1c_error_reason(int err);

typedef struct kh_h1c_limits {
    size_t header_bytes;  /* one head (status line through the blank line) -> KH_H1C_EHEADLEN;
                           * also the trailer section of a chunked body */
    size_t header_fields; /* fields of one head -> KH_H1C_EFIELDS */
    uint64_t body_bytes;  /* body bytes (after de-chunking) -> KH_H1C_EBODYLEN */
} kh_h1c_limits;

enum kh_h1c_body {
    KH_H1C_BODY_NONE = 0,    /* HEAD, 1xx, 204, 304 or Content-Length: 0 */
    KH_H1C_BODY_LENGTH = 1,  /* content_length bytes */
    KH_H1C_BODY_CHUNKED = 2, /* chunked transfer coding */
    KH_H1C_BODY_CLOSE = 3,   /* no framing: the body ends when the peer closes */
};

enum {
    KH_H1C_F_CONN_CLOSE = 1u << 0,     /* Connection: close */
    KH_H1C_F_CONN_KEEPALIVE = 1u << 1, /* Connection: keep-alive */
};

typedef struct kh_h1c_head {
    int status;
    int minor_version;
    kh_str reason;
    kh_h1_field *fields; /* in: caller's array of at least limits->header_fields entries */
    size_t num_fields;   /* out */
    int body_kind;       /* enum kh_h1c_body */
    uint64_t content_length;
    unsigned flags;      /* KH_H1C_F_* */
} kh_h1c_head;

enum kh_h1c_event {
    KH_H1C_NEED_MORE = 0, /* nothing to report: feed more bytes (or call kh_h1c_eof) */
    KH_H1C_HEAD = 1,      /* r->head holds the final head; its slices point into the input given
                           * to this call and stay valid only until the caller drops those bytes */
    KH_H1C_DATA = 2,      /* *data holds body bytes (inside the input, which the call may have
                           * rewritten in place for a chunked body) */
    KH_H1C_DONE = 3,      /* the response is complete */
};

typedef struct kh_h1c {
    int state;              /* private */
    int interim;            /* 1xx responses skipped so far */
    int seen;               /* a byte of the response has arrived */
    int no_body;            /* the request was HEAD: the response has no body whatever it says */
    uint64_t remaining;     /* KH_H1C_BODY_LENGTH: bytes still to come */
    uint64_t received;      /* body bytes delivered so far */
    kh_h1_chunked chunk;
    kh_h1c_limits lim;
    kh_h1c_head head;
    int reusable;           /* set at KH_H1C_DONE: the connection can carry the next request */
} kh_h1c;

/* Prepares r for one response. fields: caller's array of lim->header_fields entries.
 * head_request: 1 if the request was HEAD (no body follows whatever the head says). */
void kh_h1c_init(kh_h1c *r, const kh_h1c_limits *lim, kh_h1_field *fields, int head_request);

/* Feeds buf[0..len), the bytes not yet consumed. Returns how many bytes were consumed (the caller
 * drops them before the next call, which gets the rest plus whatever arrived), with *ev set; or a
 * KH_H1C_E* code. One event per call: call again with the rest while it returns an event other
 * than KH_H1C_NEED_MORE. After KH_H1C_DONE bytes left over belong to no request: a reusable
 * connection must have none (the caller checks). A chunked body is decoded in place, so buf must
 * be writable and the bytes before the returned data slice are garbage. */
ssize_t kh_h1c_feed(kh_h1c *r, char *buf, size_t len, int *ev, kh_str *data);

/* The peer closed (EOF) after every byte was fed. Returns KH_H1C_DONE when that ends a
 * read-until-close body (or the response was already done), else KH_H1C_ENORESP (nothing of a
 * response seen), KH_H1C_EMIDHEAD or KH_H1C_EMIDBODY. */
int kh_h1c_eof(kh_h1c *r);

/* 1 if the reader has seen any byte of the response (to tell "the server closed an idle pooled
 * connection" from "closed mid-response": a request on a reused connection may be retried only
 * in the first case and only if it is idempotent). */
int kh_h1c_started(const kh_h1c *r);

/* Serializes a request head: "METHOD target HTTP/1.1", Host (unless fields has one), the fields,
 * and "Content-Length: body_len" when body_len >= 0 (or when the method is POST/PUT/PATCH with no
 * body: 0), or "Transfer-Encoding: chunked" when body_len is KH_H1C_BODY_CHUNKED_LEN (a streamed
 * body of unknown length: the caller frames each piece). Fields named Content-Length, Transfer-Encoding, Connection, Upgrade, TE, Keep-Alive
 * are refused: the client owns the framing. Writes at most cap bytes to out.
 * Returns the length written, the length needed (> cap, nothing written) when cap is too small,
 * or KH_H1C_EREQ when a method/name is not a token or a target/value has a CR, LF, NUL (header
 * injection) or another control byte; *bad names the offending part. */
#define KH_H1C_BODY_CHUNKED_LEN (-2)
ssize_t kh_h1c_write_request(char *out, size_t cap, kh_str method, kh_str target, kh_str host,
                             const kh_h1_field *fields, size_t num_fields, int64_t body_len,
                             const char **bad);

#endif
