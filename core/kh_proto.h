/* kh_proto.h: protocol selection in one place. Each protocol registers how it is chosen (an
 * ALPN id over TLS, the bytes a cleartext connection starts with, an HTTP/1.1 Upgrade token,
 * or a QUIC transport it is advertised for with Alt-Svc), and the transports ask here instead
 * of knowing each other: kh_tls asks which ALPN ids to offer and starts the one picked, kh_h1
 * hands a connection over when it sees another protocol's preface or Upgrade token, and the
 * h1/h2 sinks ask which Alt-Svc to advertise. Adding a protocol adds a registration.
 * Owns:  the registry: the built-in TCP protocols (h2, http/1.1) and up to KH_PROTO_MAX
 *        registered at start-up (the HTTP/3 module registers h3), read-only once the workers run.
 * In:    kh_proto_register on the main thread before the workers start; lookups from any worker.
 * Out:   a started protocol on a kh_conn (sets c->proto); ALPN wire lists; Alt-Svc values.
 * Never: parses HTTP, or changes after the workers start (they read it without a lock). */
#ifndef KH_PROTO_H
#define KH_PROTO_H

#include <stddef.h>

#include "kh_common.h"

typedef struct kh_conn kh_conn;
typedef struct kh_stream kh_stream;
typedef struct kh_proto_vt kh_proto_vt;

enum { KH_PROTO_TCP = 0, KH_PROTO_QUIC = 1 };

typedef struct kh_proto {
    const char *name;     /* "h2" */
    int transport;        /* KH_PROTO_TCP (runs on a kh_conn) | KH_PROTO_QUIC (its own I/O) */
    const char *alpn;     /* its ALPN id (RFC 7301), or NULL */
    /* TCP: its connection interface (c->proto is set to it before start runs) and the start,
     * with no byte read yet; NULL for a protocol that runs on its own transport */
    const kh_proto_vt *vt;
    void (*start)(kh_conn *c);
    /* TCP cleartext: the bytes a connection with prior knowledge starts with, or NULL */
    const char *preface;
    size_t preface_len;
    /* TCP: the HTTP/1.1 Upgrade token it takes ("h2c"), and the switch: s is the upgrading
     * request, value the protocol's own header (HTTP2-Settings); 0 when switched. */
    const char *upgrade_token;
    int (*upgrade)(kh_conn *c, kh_stream *s, kh_str value);
    /* QUIC: advertised on TCP responses as Alt-Svc `<alpn>=":PORT"; ma=<alt_svc_max_age>` */
    unsigned alt_svc_max_age;
} kh_proto;

#define KH_PROTO_MAX 8

/* Main thread, before the workers start. Returns 0, or -1 when the registry is full. */
int kh_proto_register(const kh_proto *p);
/* Forgets what kh_proto_register added (main, after the workers stopped). */
void kh_proto_unregister_all(void);

/* The TCP protocols' ALPN ids in wire format (length-prefixed), in our order of preference:
 * what TLS offers. Returns the length written. */
size_t kh_proto_alpn_wire(unsigned char *out, size_t cap);
/* Starts on c the TCP protocol with that ALPN id; none (len 0) or an unknown one: HTTP/1.1. */
void kh_proto_start(kh_conn *c, const char *alpn, size_t len);
/* Cleartext prior knowledge: p[0..n) are the first bytes of a connection. Returns 1 after
 * switching c to the protocol whose preface they start with (the caller hands them to
 * c->proto->on_read), -1 when they could still become a preface (wait for more), 0 when no
 * registered preface matches. */
int kh_proto_sniff(kh_conn *c, const char *p, size_t n);
/* The registered protocol that takes HTTP/1.1 Upgrade token `token`, or NULL. */
const kh_proto *kh_proto_by_upgrade(const char *token, size_t len);
/* Alt-Svc value for a TLS listener on `port` (every registered QUIC protocol), "" when none.
 * Returns the length. */
size_t kh_proto_alt_svc(int port, char *out, size_t cap);

#endif
