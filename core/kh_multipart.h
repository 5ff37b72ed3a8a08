/* kh_multipart.h: sans-io multipart/form-data parser (RFC 7578 on RFC 2046 §5.1), pull style.
 * Owns:  its own state, the delimiter ("\r\n--" + boundary) and the current part's header block
 *        (a buffer the caller gives at init, max_header_bytes long).
 * In:    the body in chunks cut anywhere; the caller passes each chunk with an offset and gets
 *        back one event and the offset after what that event consumed (kh_mp_next), then calls
 *        again from there; kh_mp_finish at the end of the body.
 * Out:   events: a part's header fields, the end of its headers, its data in pieces, its end,
 *        the end of the body; or an error with a reason (the caller answers 400).
 * Never: allocates, reads outside [in, in + len), copies data bytes (a DATA event points into
 *        the input, or into the delimiter for the few bytes held back across a chunk edge), or
 *        looks at a byte twice more than the delimiter's length: the delimiter search is memchr
 *        for CR, then at most len(delimiter) compares, and a boundary has no CR, so a failed
 *        match never needs a rescan (no quadratic input).
 *
 * Rules: the body may start with a preamble (ignored) before the first "--boundary"; after a
 * delimiter comes "--" (the close: the epilogue is ignored) or optional spaces/tabs then CRLF;
 * header lines end with CRLF, a name is a token, no obs-fold, no control byte but HT in a value
 * (UTF-8 is allowed: browsers send raw UTF-8 file names); a body that ends before the close
 * delimiter is an error (truncated). */
#ifndef KH_MULTIPART_H
#define KH_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

#define KH_MP_BOUNDARY_MAX 70 /* RFC 2046 §5.1.1 */

enum kh_mp_event {
    KH_MP_ERROR = -1, /* p->error says why; every later call returns it again */
    KH_MP_NEED_MORE = 0, /* the whole input was consumed: feed the next chunk */
    KH_MP_HEADER,        /* name, value: one header field of the current part */
    KH_MP_HEADERS_END,   /* the part's data follows */
    KH_MP_DATA,          /* data, len: a piece of the part's data (never empty) */
    KH_MP_PART_END,
    KH_MP_DONE,          /* the close delimiter was seen; the rest is epilogue */
};

typedef struct kh_mp_limits {
    uint64_t max_parts;        /* parts in the body */
    uint64_t max_header_bytes; /* one part's header block, CRLFs included (<= hbuf size) */
    uint64_t max_part_bytes;   /* one part's data */
    uint64_t max_total_bytes;  /* the whole body, preamble and epilogue included */
} kh_mp_limits;

typedef struct kh_multipart {
    /* the current event's values; valid until the next call */
    const char *name, *value, *data;
    size_t name_len, value_len, len;
    const char *error; /* a static string once an error was returned */

    /* private */
    int state;
    char delim[4 + KH_MP_BOUNDARY_MAX];
    size_t dlen;
    size_t matched;  /* delimiter bytes matched at the end of the previous chunk */
    char *hbuf;      /* the header block, accumulated */
    size_t hlen, hcap, hpos; /* hpos: next line to emit */
    uint64_t parts, part_bytes, total;
    kh_mp_limits lim;
} kh_multipart;

/* boundary: the Content-Type's boundary parameter, unquoted (1-70 bchars: digits, letters and
 * '()+_,-./:=? ', not ending in a space). hbuf: lim->max_header_bytes bytes the caller owns for
 * as long as the parser. Returns 0, or -1 with p->error set (a bad boundary). */
int kh_mp_init(kh_multipart *p, const char *boundary, size_t blen, char *hbuf,
               const kh_mp_limits *lim);

/* One event from in[*off..len); *off is advanced past what the event consumed. */
int kh_mp_next(kh_multipart *p, const char *in, size_t len, size_t *off);

/* The body ended: 0 when the close delimiter was seen, else -1 with p->error set. */
int kh_mp_finish(kh_multipart *p);

#endif
