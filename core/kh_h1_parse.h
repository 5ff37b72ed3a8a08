/* kh_h1_parse.h: sans-io RFC 9112 request-head parser, in-place chunked decoder, and the
 * HTTP2-Settings check of an h2c Upgrade (RFC 7540 §3.2.1).
 * Owns:  nothing. The caller owns the input buffer; every kh_str the parser fills points into it.
 * In:    bytes of a request head (possibly incomplete), limits.
 * Out:   slices for method, target, path, query, headers; framing facts (CL / chunked), flags.
 * Never: allocates, touches I/O, keeps state between calls (except the chunked decoder's struct). */
#ifndef KH_H1_PARSE_H
#define KH_H1_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kh_common.h"
#include "kh_err.h"

/* Parser errors: each maps to one HTTP status (kh_h1_error_status) and one reason string.
 * After any of these the connection must be closed: framing can no longer be trusted. */
enum {
    KH_H1_EBADREQ = -5100,      /* 400: malformed request line or header line */
    KH_H1_EMETHOD = -5101,      /* 400: invalid token character in the method */
    KH_H1_ETARGET = -5102,      /* 400: invalid request-target */
    KH_H1_EVERSION = -5103,     /* 505: HTTP major version other than 1 */
    KH_H1_EBADVERSION = -5104,  /* 400: malformed HTTP-version */
    KH_H1_EFIELDNAME = -5105,   /* 400: invalid token character in a field name (or empty name) */
    KH_H1_EWSCOLON = -5106,     /* 400: whitespace between field name and colon (RFC 9112 §5.1) */
    KH_H1_EFIELDVALUE = -5107,  /* 400: control character / NUL in a field value */
    KH_H1_EOBSFOLD = -5108,     /* 400: obs-fold line (RFC 9112 §5.2) */
    KH_H1_EBARECR = -5109,      /* 400: CR not followed by LF */
    KH_H1_EBARELF = -5110,      /* 400: LF not preceded by CR (we accept only CRLF) */
    KH_H1_EFRAMING = -5111,     /* 400: CL with TE, differing duplicate CL, TE in HTTP/1.0, chunked not last */
    KH_H1_EBADCL = -5112,       /* 400: Content-Length not a valid non-negative decimal (or overflow) */
    KH_H1_ETE = -5113,          /* 501: Transfer-Encoding other than chunked */
    KH_H1_ENOHOST = -5114,      /* 400: HTTP/1.1 without Host, more than one Host, or an invalid Host */
    KH_H1_ETARGETLEN = -5115,   /* 414: request-target longer than target_bytes */
    KH_H1_EHEADLEN = -5116,     /* 431: head longer than header_bytes */
    KH_H1_EFIELDS = -5117,      /* 431: more than header_fields fields */
    KH_H1_EEXPECT = -5118,      /* 417: Expect with anything but 100-continue */
    KH_H1_ECHUNK = -5119,       /* 400: bad chunk size / chunk framing / trailer */
    KH_H1_EBODYLEN = -5120,     /* 413: a chunk size that takes the body past body_bytes */
    KH_H1_EH2SETTINGS = -5121,  /* 400: Upgrade: h2c with HTTP2-Settings missing, repeated or invalid */
};

/* Returns the HTTP status for a KH_H1_E* code (400 for anything unknown). */
int kh_h1_error_status(int err);
/* Returns a short human reason for a KH_H1_E* code, e.g. "obs-fold in header". Never NULL. */
const char *kh_h1_error_reason(int err);

typedef struct kh_h1_limits {
    size_t header_bytes;  /* whole head incl. request line and the final CRLF -> KH_H1_EHEADLEN */
    size_t header_fields; /* number of header lines -> KH_H1_EFIELDS */
    size_t target_bytes;  /* request-target length -> KH_H1_ETARGETLEN */
    uint64_t body_bytes;  /* chunked decoder only: sum of the chunk sizes -> KH_H1_EBODYLEN
                           * (0: no body at all; the head parser ignores it) */
} kh_h1_limits;

typedef struct kh_h1_field {
    kh_str name;  /* as received (case preserved); no surrounding whitespace */
    kh_str value; /* leading and trailing OWS removed */
} kh_h1_field;

enum kh_h1_body_kind {
    KH_H1_BODY_NONE = 0,    /* no Content-Length, no Transfer-Encoding: body length 0 */
    KH_H1_BODY_LENGTH = 1,  /* content_length bytes follow (may be 0) */
    KH_H1_BODY_CHUNKED = 2, /* chunked transfer coding */
};

enum kh_h1_target_form {
    KH_H1_ORIGIN_FORM = 0,   /* /path?query */
    KH_H1_ABSOLUTE_FORM = 1, /* http://host[:port]/path?query: authority filled, path/query from it */
    KH_H1_ASTERISK_FORM = 2, /* "*", only with OPTIONS; path = "*" */
    KH_H1_AUTHORITY_FORM = 3 /* host:port, only with CONNECT; authority filled, path empty */
};

enum {
    KH_H1_F_CONN_CLOSE = 1u << 0,      /* Connection: close */
    KH_H1_F_CONN_KEEPALIVE = 1u << 1,  /* Connection: keep-alive */
    KH_H1_F_CONN_UPGRADE = 1u << 2,    /* Connection: upgrade */
    KH_H1_F_EXPECT_CONTINUE = 1u << 3, /* Expect: 100-continue */
    KH_H1_F_HAS_UPGRADE = 1u << 4,     /* an Upgrade header is present (value in upgrade) */
};

typedef struct kh_h1_head {
    kh_str method;
    kh_str target;         /* the raw request-target */
    kh_str path;           /* origin-form path, or the path part of absolute-form ("/" if empty) */
    kh_str query;          /* after '?', without it; ptr NULL when there is no '?' */
    kh_str authority;      /* absolute-form / authority-form authority; else empty */
    kh_str host;           /* value of the Host header (empty if none) */
    kh_str upgrade;        /* value of the Upgrade header (empty if none) */
    int minor_version;     /* 0 or 1 (HTTP/1.2+ is treated as 1) */
    int target_form;       /* enum kh_h1_target_form */
    int body_kind;         /* enum kh_h1_body_kind */
    uint64_t content_length;
    unsigned flags;        /* KH_H1_F_* */
    kh_h1_field *fields;   /* in: caller's array of at least limits->header_fields entries */
    size_t num_fields;     /* out: number filled */
} kh_h1_head;

/* Parses one request head from buf[0..len).
 * prev_len: how many bytes of buf were already seen by the previous call that returned KH_EAGAIN on
 * the same request (0 on the first call), so the search for the end of the head does not rescan.
 * Leading empty lines (CRLF) before the request line are skipped and counted in the return value.
 * Returns: the number of bytes the head occupies (through the blank line) on success; KH_EAGAIN when
 * the head is incomplete and no error is visible yet; or a KH_H1_E* code. For any input, every
 * proper prefix returns KH_EAGAIN or the same error code as the whole input.
 * A malformed line is reported once the result can no longer change: a request line at its CRLF;
 * a header line at the blank line that ends the head, at a bare LF, or once a limit is passed
 * (header_bytes -> 431; a request line longer than target_bytes + 64 -> 414 before its CRLF
 * arrives); until then KH_EAGAIN. The result never
 * depends on how the bytes were split nor on prev_len (given honestly).
 * On success every non-empty kh_str in *out points into buf (absolute-form without a path: path
 * is the second '/' of "://"); empty ones may have a NULL ptr. The head, leading empty lines
 * included, is at most header_bytes long. On a KH_H1_E* code, out->method is the request line's
 * method when the line got that far (a tchar run followed by SP), else left as the caller set it
 * (so a caller can answer a HEAD request's error without content). */
ssize_t kh_h1_parse_request(const char *buf, size_t len, size_t prev_len, kh_h1_head *out,
                            const kh_h1_limits *lim);

/* In-place chunked body decoder (RFC 9112 §7.1). Zero-initialise before the first call. */
typedef struct kh_h1_chunked {
    uint64_t remaining; /* bytes left in the current chunk's data */
    uint64_t total;     /* sum of the chunk sizes so far (<= lim->body_bytes) */
    uint32_t state;     /* private */
    uint32_t hex_digits;
    size_t line_bytes;  /* bytes of the current size line / trailer section, to cap them */
    size_t trailer_bytes;
    size_t trailer_fields;
    int done;           /* set to 1 once the last chunk and the trailer section are consumed */
} kh_h1_chunked;

/* Decodes chunked data in buf[0..len) in place: the chunk payload bytes are moved to the front of
 * buf and their count stored in *out_len. Returns the number of input bytes consumed: len while the
 * body goes on, or fewer once d->done is set (the rest of buf belongs to the next request).
 * Returns KH_H1_ECHUNK on bad framing, KH_H1_EBODYLEN as soon as a chunk-size line ends (its LF)
 * whose size takes the sum of the sizes past lim->body_bytes (before any of that chunk's data is
 * read), KH_H1_EHEADLEN / KH_H1_EFIELDS when the trailer section passes lim, or a trailer field
 * error code. Trailer fields are checked and discarded. After an error *out_len is 0 and the
 * decoder must not be called again (the connection closes: framing is lost). */
ssize_t kh_h1_chunked_decode(kh_h1_chunked *d, char *buf, size_t len, size_t *out_len,
                             const kh_h1_limits *lim);

/* HTTP2-Settings of an Upgrade: h2c request (RFC 7540 §3.2.1): token68 holding the base64url
 * (RFC 4648 §5, no padding) of a SETTINGS payload. Valid when the value is 8k characters of the
 * base64url alphabet (k >= 1), so it decodes with no bits left over into k 6-byte entries,
 * k <= KH_H1_H2_SETTINGS_MAX, each with a value HTTP/2 allows (RFC 9113 §6.5.2, RFC 8441 §3,
 * RFC 9218 §2.1: ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL and NO_RFC7540_PRIORITIES 0 or 1,
 * INITIAL_WINDOW_SIZE <= 2^31-1, MAX_FRAME_SIZE in [2^14, 2^24-1]; unknown ids are ignored, as
 * §6.5.2 says). Writes the payload to out (at least KH_H1_H2_SETTINGS_MAX * 6 bytes) and returns
 * its length, or KH_H1_EH2SETTINGS. */
#define KH_H1_H2_SETTINGS_MAX 32 /* nghttp2's default cap on the entries of one SETTINGS frame */
ssize_t kh_h1_h2_settings(kh_str value, uint8_t *out);

/* The check HTTP/1.1 applies to a Host value and to an absolute-form target's authority
 * (RFC 3986 §3.2.2 host [":" port], no userinfo: RFC 9110 §4.2.4): reg-name characters with
 * well-formed %XX, or a bracketed IPv6 literal; an optional port of digits up to 65535. 1 if the
 * value passes, else 0 (an empty value fails). For other protocols' authority fields (h2
 * :authority, RFC 9113 §8.3.1), so that every protocol refuses the same values. */
int kh_h1_host_ok(kh_str value);

/* 1 if every byte of p[0..n) is a field-value byte (RFC 9110 §5.5: HTAB, SP, VCHAR, obs-text),
 * the scan the parser makes over an HTTP/1.1 value (16 bytes a round with SSE2), else 0. For the
 * other protocols' field values (h2: kh_h2_fields.c), so that every protocol takes the same
 * bytes; edge whitespace is the caller's rule. */
int kh_h1_value_bytes_ok(const char *p, size_t n);

#endif
