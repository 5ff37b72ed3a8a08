/* kh_h2_fields.h: the RFC 9113 §8 checks of a request's header and trailer fields (sans-io).
 * kh_h2.c runs nghttp2's server session with nghttp2_option_set_no_http_messaging and makes
 * these checks itself, in the on_header pass it makes anyway; kh_h2_fields.c says why. */
#ifndef KH_H2_FIELDS_H
#define KH_H2_FIELDS_H

#include <stddef.h>
#include <stdint.h>

enum {
    KH_H2F_METHOD = 1u << 0, /* the pseudo-headers seen (each at most once) */
    KH_H2F_SCHEME = 1u << 1,
    KH_H2F_PATH = 1u << 2,
    KH_H2F_AUTHORITY = 1u << 3,
    KH_H2F_PROTOCOL = 1u << 4,
    KH_H2F_HOST = 1u << 5,        /* a host field (at most one) */
    KH_H2F_REGULAR = 1u << 6,     /* a regular field came: no pseudo-header after it */
    KH_H2F_CONNECT = 1u << 7,     /* :method CONNECT */
    KH_H2F_OPTIONS = 1u << 8,     /* :method OPTIONS */
    KH_H2F_HTTP = 1u << 9,        /* :scheme http or https (any case) */
    KH_H2F_SLASH = 1u << 10,      /* :path starts with '/' */
    KH_H2F_STAR = 1u << 11,       /* :path is "*" */
    KH_H2F_TRAILER = 1u << 12,    /* the block is a trailer section: no pseudo-header */
    KH_H2F_PRIORITY = 1u << 13,   /* a priority field parsed (urgency, incremental) */
    KH_H2F_BAD_PRIORITY = 1u << 14, /* a priority field that does not parse: all are ignored */
};

/* One header block's state (a block is never interleaved with another: RFC 9113 §6.10). */
typedef struct kh_h2_fields {
    uint32_t flags;
    uint8_t urgency;     /* RFC 9218 §4.1, 0..7 (default 3) */
    uint8_t incremental; /* RFC 9218 §4.2 (default 0) */
    int64_t clen;        /* content-length, -1 when none */
} kh_h2_fields;

/* Starts a block: a request head (trailer 0) or a trailer section (trailer 1). */
void kh_h2_fields_begin(kh_h2_fields *f, int trailer);

/* One field as HPACK decoded it. 0: fine; -1: the request is malformed (RFC 9113 §8.1.1: a
 * stream error PROTOCOL_ERROR). */
int kh_h2_fields_check(kh_h2_fields *f, const uint8_t *name, size_t nlen, const uint8_t *value,
                       size_t vlen);

/* The end of a request head: the pseudo-headers it needs (§8.3.1, RFC 8441 §4), and a
 * content-length other than 0 on a head that ends the stream. 0 or -1. A CONNECT without
 * :protocol has its clen set to -1 (its DATA is a tunnel's, not a body). */
int kh_h2_fields_request_end(kh_h2_fields *f, int end_stream);

/* A priority field's value (RFC 9218 §4: a Structured Fields dictionary; u and i are read,
 * other members skipped). 0, with *urgency and *incremental updated, or -1 (does not parse). */
int kh_h2_fields_priority(const uint8_t *p, size_t n, uint8_t *urgency, uint8_t *incremental);

#endif
