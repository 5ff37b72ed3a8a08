/* kh_cond.h: conditional requests (RFC 9110 §13): entity-tag lists and HTTP-dates.
 * Owns:  nothing; pure functions on slices.
 * In:    request validators (If-None-Match, If-Modified-Since) and response validators (ETag,
 *        Last-Modified) as the stream has them.
 * Out:   whether a GET/HEAD 200 is "not modified" (the engine then answers 304), and the subset
 *        of response fields a 304 keeps.
 * Never: allocates, touches I/O, or knows a protocol. */
#ifndef KH_COND_H
#define KH_COND_H

#include <stddef.h>
#include <stdint.h>

#include "kh_common.h"

typedef struct kh_header kh_header;

/* An HTTP-date (RFC 9110 §5.6.7: IMF-fixdate, and the obsolete rfc850 and asctime forms a
 * recipient must accept) -> seconds since the epoch; -1 when it is not one. */
int64_t kh_cond_parse_date(const char *p, size_t n);

/* 1 when the entity-tag etag (one entity-tag, as an ETag field holds it) is in list (an
 * If-None-Match / If-Match value: "*" or 1#entity-tag). weak: the weak comparison (§8.8.3.2,
 * If-None-Match), else the strong one (If-Match). 0 when it is not, or when either is malformed
 * (a malformed list matches nothing). "*" matches any etag, even an empty one (etag.len == 0
 * means the response has none: only "*" matches then). */
int kh_cond_etag_match(kh_str list, kh_str etag, int weak);

/* RFC 9110 §13.2.2 steps 3-4 for a GET or HEAD that would be answered 200: 1 when the answer is
 * 304. inm / ims: the request's If-None-Match / If-Modified-Since (ptr NULL when absent);
 * etag / last_modified: the response's ETag / Last-Modified (ptr NULL when absent).
 * If-None-Match wins over If-Modified-Since; an unparsable date is ignored. */
int kh_cond_not_modified(kh_str inm, kh_str ims, kh_str etag, kh_str last_modified);

/* Copies into out (room for n) the response fields a 304 carries (§15.4.5: Cache-Control,
 * Content-Location, Date, ETag, Expires, Vary; also Last-Modified, X-Request-Id and the
 * Access-Control-* fields, so a CORS revalidation keeps working). Returns how many. */
size_t kh_cond_304_headers(const kh_header *h, size_t n, kh_header *out);

#endif
