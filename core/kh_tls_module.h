/* kh_tls_module.h: the seam between the khamsin binary and khamsin-tls.so.
 * Why a module: mapping libssl and libcrypto costs about 5 ms of page faults at every exec on a
 * small VM (an empty program linked with -lssl -lcrypto starts in 8.2 ms, 3.0 ms without), so the
 * TLS transport (KH_TLS_MODULE_SOURCES in CMakeLists.txt: every core file that includes OpenSSL)
 * is built as a module that only a server with a TLS listener loads. OpenSSL is linked into the
 * module (KH_STATIC_OPENSSL, its symbols hidden), so that loading it resolves no OpenSSL symbol:
 * with libssl.so and libcrypto.so the dlopen took 4.3 M instructions, mostly symbol lookups for
 * libcrypto's relocations; now 0.4 M (bench/startup.sh).
 * Owns:  nothing; it only describes the table.
 * In/Out: the module exports one function, KH_TLS_MODULE_ENTRY, returning a table of kh_tls.h's
 *        functions; kh_tls_load.c in the binary dlopens the module and calls through that table.
 *        The module takes core's functions (kh_log_write, kh_buf_*, kh_proto_start, ...)
 *        from the binary, which exports every kh_* symbol (-Wl,--export-dynamic-symbol=kh_*).
 * Never: crosses with a module built from other sources: the ABI number, the version and the
 *        sizes of the structs both sides touch must match, or the loader refuses the module. */
#ifndef KH_TLS_MODULE_H
#define KH_TLS_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "kh_tls.h"
#include "kh_tls_client.h"

#define KH_TLS_MODULE_ABI 2
#define KH_TLS_MODULE_ENTRY "kh_tls_module_get"
#define KH_TLS_MODULE_FILE "khamsin-tls.so"

typedef struct kh_tls_module_vt {
    uint32_t abi;        /* KH_TLS_MODULE_ABI: bumped when this table changes */
    uint32_t vt_size;    /* sizeof(kh_tls_module_vt) */
    uint32_t conn_size;  /* sizeof(kh_conn) and sizeof(kh_worker) as the module saw them: a */
    uint32_t worker_size; /* module built against other headers is refused, not run */
    const char *version; /* KH_VERSION */
    kh_tls_ctx *(*ctx_new)(const kh_tls_opts *o, char *err, size_t errlen);
    const char *(*ctx_spki_sha256)(const kh_tls_ctx *t);
    void (*ctx_free)(kh_tls_ctx *t);
    kh_tls *(*conn_new)(kh_tls_ctx *t, kh_conn *c);
    void (*conn_free)(kh_tls *s, kh_bufcache *bufs);
    int (*read)(kh_tls *s, const char *p, size_t n);
    kh_buf *(*write)(kh_tls *s, kh_buf *plain);
    int (*close_notify)(kh_tls *s);
    int (*established)(const kh_tls *s);
    /* abi 2: the certificate hand-off to the QUIC module */
    int (*ctx_export_pem)(const kh_tls_ctx *t, char **chain, size_t *chain_len, char **key,
                          size_t *key_len);
    void (*pem_free)(char *p, size_t len);
    /* the client side, for outbound connections (kh_tls_client.h; added in ABI 2) */
    kh_tls_client *(*client_new)(const kh_tls_client_opts *o, char *err, size_t errlen);
    void (*client_free)(kh_tls_client *c);
    void (*client_feed)(kh_tls_client *c, const char *p, size_t n);
    int (*client_handshake)(kh_tls_client *c, char *err, size_t errlen);
    int (*client_read)(kh_tls_client *c, char *out, size_t cap);
    int (*client_write)(kh_tls_client *c, const char *p, size_t n);
    size_t (*client_pending)(kh_tls_client *c, char *out, size_t cap);
    const char *(*client_alpn)(kh_tls_client *c);
} kh_tls_module_vt;

typedef const kh_tls_module_vt *(*kh_tls_module_entry_fn)(void);

/* Inside the module only (kh_tls.c, kh_tls_client.c): loads OpenSSL's error strings, once, before
 * an error is formatted. kh_tls_module_get initialises OpenSSL without them: OpenSSL 3.0 loads
 * every library's strings with the first error state a thread makes (in the first fetch of any
 * algorithm, so at every start-up with a TLS listener), which cost ~1.0 M instructions and ~20
 * page faults on the way to the first answer (bench/startup.sh), for text that only an error
 * needs. Loaded late, the legacy per-library loaders cover every library but the 3.0 ones
 * (PROV, DECODER, ...), whose reasons print as numbers ("reason(100)"). Thread-safe. */
void kh_tls_err_strings(void);

#endif
