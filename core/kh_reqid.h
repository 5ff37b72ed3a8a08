/* kh_reqid.h: a request's id (req.id, the error and access logs, the X-Request-Id response
 * header as limit request_id_header says: kh_stream.c send_head_extra).
 * The client's (first) X-Request-Id when it is sane: 1 to KH_REQID_MAX bytes of visible ASCII
 * (0x21 to 0x7e); else one made here: "<8 hex digits, random per process>-<worker>-<the
 * stream's per-worker number>". Both are computed from the stream, so every caller gets the same
 * id for a request and nothing is stored per stream. */
#ifndef KH_REQID_H
#define KH_REQID_H

#include <stddef.h>

#include "kh_stream.h"

#define KH_REQID_MAX 128

/* Writes the id to out (room for KH_REQID_MAX bytes; not NUL-terminated) and returns its
 * length. */
size_t kh_reqid(const kh_stream *s, char *out);
/* The client's (first) X-Request-Id field when it is sane, else NULL. */
const kh_header *kh_reqid_client(const kh_stream *s);
/* 1 when v (len bytes) may be echoed as a request id. */
int kh_reqid_sane(const char *v, size_t len);

#endif
