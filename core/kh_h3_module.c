/* kh_h3_module.c: the one exported symbol of khamsin-h3.so (see kh_h3_module.h).
 * Owns:  the table of the module's calls (kh_quic.c's context and worker functions).
 * In:    a call from kh_h3_load.c right after dlopen.
 * Out:   the table; every other symbol of the module stays hidden (-fvisibility=hidden). */
#include "kh_h3_module.h"

#include "kh_common.h"
#include "kh_conn.h"
#include "kh_quic.h"
#include "kh_stream.h"
#include "kh_worker.h"

#ifndef KH_VERSION
#define KH_VERSION "0.0.0"
#endif

static const kh_h3_module_vt vt = {
    .abi = KH_H3_MODULE_ABI,
    .vt_size = sizeof(kh_h3_module_vt),
    .conn_size = sizeof(kh_conn),
    .worker_size = sizeof(kh_worker),
    .stream_size = sizeof(kh_stream),
    .version = KH_VERSION,
    .ctx_new = kh_quic_ctx_new,
    .ctx_free = kh_quic_ctx_free,
    .worker_open = kh_quic_worker_open,
    .worker_close = kh_quic_worker_close,
    .versions = kh_h3_versions,
};

KH_EXPORT const kh_h3_module_vt *kh_h3_module_get(void);

const kh_h3_module_vt *kh_h3_module_get(void)
{
    return &vt;
}
