/* kh_h1.h: HTTP/1.1 on a kh_conn (RFC 9112): keep-alive, pipelining one request at a time,
 * Content-Length and chunked bodies, 100-continue, HEAD, error replies that close. */
#ifndef KH_H1_H
#define KH_H1_H

#include "kh_conn.h"

extern const kh_proto_vt kh_h1_proto;

/* Called once a connection is accepted: starts the header timeout. */
void kh_h1_start(kh_conn *c);

#endif
