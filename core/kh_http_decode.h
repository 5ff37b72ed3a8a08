/* kh_http_decode.h: Content-Encoding decoders for the HTTP client (gzip and deflate on zlib,
 * zstd on libzstd), streaming, with a bound on the decoded size (a decompression bomb stops at
 * the body limit, not at the memory limit).
 * Owns:  the zlib / zstd stream state of one response body.
 * In:    encoded bytes as they arrive; the end of the body.
 * Out:   decoded bytes through a callback; KH_HD_E* errors.
 * Never: decodes past max_out bytes; touches I/O. */
#ifndef KH_HTTP_DECODE_H
#define KH_HTTP_DECODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    KH_HD_EDATA = -5190,    /* corrupt compressed data */
    KH_HD_ETOOBIG = -5191,  /* decoded body over max_out */
    KH_HD_ETRUNC = -5192,   /* the body ended inside the compressed stream */
};

enum kh_hd_kind { KH_HD_NONE = 0, KH_HD_GZIP = 1, KH_HD_DEFLATE = 2, KH_HD_ZSTD = 3 };

typedef struct kh_hd kh_hd;
typedef void (*kh_hd_out)(void *arg, const char *p, size_t n);

/* kind from a Content-Encoding value ("gzip", "x-gzip", "deflate", "zstd"; case-insensitive);
 * KH_HD_NONE for "identity" or an empty value; -1 for anything else (left encoded). */
int kh_hd_kind_of(const char *value, size_t len);
kh_hd *kh_hd_new(int kind, uint64_t max_out);
/* Decodes in[0..n) and hands the output to out(arg, ...). Returns 0 or a KH_HD_E* code. */
int kh_hd_feed(kh_hd *d, const char *in, size_t n, kh_hd_out out, void *arg);
/* The body ended: 0 when the compressed stream ended too, else KH_HD_ETRUNC. */
int kh_hd_finish(kh_hd *d);
void kh_hd_free(kh_hd *d);
const char *kh_hd_error_reason(int err);

#endif
