/* kh_h3_module.h: the seam between the khamsin binary and khamsin-h3.so (QUIC + HTTP/3).
 * Why a module: as for TLS (kh_tls_module.h), a server without --http3 maps none of ngtcp2,
 * nghttp3 and GnuTLS; only `--http3` loads it (kh_h3_load.c, found the way khamsin-tls.so is).
 * Owns:  nothing; it describes the table and the binary-side calls.
 * In/Out: the module exports KH_H3_MODULE_ENTRY, returning a table; the module takes core's
 *        kh_* functions (kh_stream_*, kh_worker_*, kh_log_write, ...) and uv_* from the binary,
 *        which exports them (CMakeLists.txt: --export-dynamic-symbol, and --undefined for the
 *        uv_udp_* functions the binary itself never calls).
 * Never: crosses with a module built from other sources: ABI number, version and the sizes of
 *        kh_conn, kh_worker and kh_stream must match, or the loader refuses the module. */
#ifndef KH_H3_MODULE_H
#define KH_H3_MODULE_H

#include <stddef.h>
#include <stdint.h>

#define KH_H3_MODULE_ABI 1
#define KH_H3_MODULE_ENTRY "kh_h3_module_get"
#define KH_H3_MODULE_FILE "khamsin-h3.so"

typedef struct kh_worker kh_worker;
typedef struct kh_h3_ctx kh_h3_ctx;
typedef struct kh_tls_ctx kh_tls_ctx;

typedef struct kh_h3_opts {
    const char *cert_pem; /* the TLS module's default certificate chain and key (PEM) */
    size_t cert_len;
    const char *key_pem;
    size_t key_len;
} kh_h3_opts;

typedef struct kh_h3_module_vt {
    uint32_t abi;
    uint32_t vt_size;
    uint32_t conn_size;   /* sizeof(kh_conn), sizeof(kh_worker), sizeof(kh_stream) as the */
    uint32_t worker_size; /* module saw them */
    uint32_t stream_size;
    const char *version;
    /* main thread, before the workers start */
    kh_h3_ctx *(*ctx_new)(const kh_h3_opts *o, char *err, size_t errlen);
    void (*ctx_free)(kh_h3_ctx *ctx);
    /* on the worker's thread: read the worker's UDP sockets (cfg->listens[i].udp_fds[w->id]) */
    int (*worker_open)(kh_worker *w, kh_h3_ctx *ctx, char *err, size_t errlen);
    /* on the worker's thread, once its connections are gone: close the sockets */
    void (*worker_close)(kh_worker *w);
    const char *(*versions)(void); /* "ngtcp2 0.12.1, nghttp3 0.8.0, GnuTLS 3.7.9" */
} kh_h3_module_vt;

typedef const kh_h3_module_vt *(*kh_h3_module_entry_fn)(void);

/* The binary's side (kh_h3_load.c). kh_h3_setup loads the module, hands it tls's certificate
 * and key and registers h3 with kh_proto (Alt-Svc); returns NULL with a message in err. */
kh_h3_ctx *kh_h3_setup(kh_tls_ctx *tls, char *err, size_t errlen);
void kh_h3_teardown(kh_h3_ctx *ctx);
int kh_h3_worker_open(kh_worker *w, char *err, size_t errlen);
void kh_h3_worker_close(kh_worker *w);

#endif
