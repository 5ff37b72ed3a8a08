/* kh_compress.h: response compression (gzip on zlib, br on libbrotlienc, zstd on libzstd).
 * Owns:  an encoder's codec state and its output buffer.
 * In:    the request's Accept-Encoding, the response's status, fields and length (to choose);
 *        body chunks (to encode), each ended by a flush or by the finish.
 * Out:   the coding to use (or none), compressed bytes in the encoder's buffer.
 * Never: touches I/O, a stream or a protocol: kh_stream calls it (kh_stream_send_head /
 *        send_data / respond), so every protocol and every reply path (whole bodies, res:write,
 *        SSE) gets the same behaviour. */
#ifndef KH_COMPRESS_H
#define KH_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "kh_common.h"
#include "kh_limits.h"

typedef struct kh_header kh_header;

enum kh_coding { KH_CODING_NONE = 0, KH_CODING_GZIP, KH_CODING_BR, KH_CODING_ZSTD };

/* "gzip" | "br" | "zstd" | NULL for KH_CODING_NONE */
const char *kh_compress_name(int coding);

/* The coding for Accept-Encoding (RFC 9110 §12.5.3): the highest q-value among gzip (x-gzip),
 * br and zstd, "*" standing for the codings not named; q=0 refuses; ties go zstd > br > gzip
 * (cheapest CPU per byte saved first). KH_CODING_NONE when none is acceptable or ae.ptr is NULL. */
int kh_compress_negotiate(kh_str ae);

/* 1 when a Content-Type is worth compressing: text/ (any), JSON, JavaScript, XML (and +json, +xml
 * suffixes), SVG, WebAssembly, TTF/OTF fonts. Parameters (; charset=...) are ignored. */
int kh_compress_type_ok(kh_str content_type);

/* Whether a response is eligible at all (1) - the compress limit is on, the status has content
 * and is not 206, the request is not HEAD, the response has a compressible Content-Type, no
 * Content-Encoding and no Content-Range, and content_length is -1 (streamed) or at least
 * compress_min_bytes - and then the coding for ae (which may be KH_CODING_NONE: the response
 * still varies on Accept-Encoding). 0 when not eligible. */
int kh_compress_choose(const kh_limits *l, int status, int head_method, kh_str ae,
                       const kh_header *h, size_t n, int64_t content_length, int *coding);

typedef struct kh_compress kh_compress;

/* A new encoder at the limit's level for coding; NULL when out of memory. size_hint: the whole
 * input's length when known (whole bodies), else -1. */
kh_compress *kh_compress_new(int coding, const kh_limits *l, int64_t size_hint);

/* Encodes n bytes; then flushes (fin == 0: everything so far can be decoded, as each res:write
 * / SSE event must reach the client now) or finishes the stream (fin == 1). The output is
 * appended to kh_compress_out(z) (its length in *len), which the caller drains with
 * kh_compress_consumed. Returns 0, or KH_ENOMEM / KH_EPROTO. */
int kh_compress_write(kh_compress *z, const char *p, size_t n, int fin);
const char *kh_compress_out(const kh_compress *z, size_t *len);
void kh_compress_consumed(kh_compress *z);
void kh_compress_free(kh_compress *z);

#endif
