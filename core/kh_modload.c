/* kh_modload.c: see kh_modload.h. */
#include "kh_modload.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kh_log.h"

typedef const void *(*entry_fn)(void);

/* Opens one candidate. Returns 1 and sets *vt when loaded, 0 when the file cannot be opened
 * (err gets why, the caller tries the next path), -1 when it opened but is not a module this
 * binary can use. */
static int try_load(const kh_modload_spec *m, const char *path, const void **vt, char *err,
                    size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : path);
        return 0;
    }
    entry_fn entry;
    void *sym = dlsym(h, m->entry);
    memcpy(&entry, &sym, sizeof entry); /* POSIX: a function pointer's bits in a void * */
    const void *t = sym ? entry() : NULL;
    if (t == NULL) {
        snprintf(err, errlen, "%s: no %s(): not a khamsin %s module", path, m->entry, m->kind);
        return -1;
    }
    if (m->check(t, path, err, errlen) != 0)
        return -1;
    KH_LOG_DEBUG("%s: loaded %s", m->log, path);
    *vt = t;
    return 1;
}

const void *kh_modload(const kh_modload_spec *m, char *err, size_t errlen)
{
    const void *vt = NULL;
    char why[600];
    const char *env = getenv(m->env);
    if (env && *env) {
        if (try_load(m, env, &vt, why, sizeof why) > 0)
            return vt;
        snprintf(err, errlen, "%s needs the module %s (%s), which did not load: %s", m->needs, env,
                 m->env, why);
        return NULL;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, errlen, "%s needs %s: cannot find the binary's directory (/proc/self/exe); "
                 "set %s to the module's path", m->needs, m->file, m->env);
        return NULL;
    }
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    static const char *const rel[] = {"/", "/../lib/khamsin/", "/../lib/lua/5.1/khamsin/"};
    char tried[1400] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s%s%s", exe, rel[i], m->file);
        int r = try_load(m, path, &vt, why, sizeof why);
        if (r > 0)
            return vt;
        if (r < 0) {
            snprintf(err, errlen, "%s module unusable: %s", m->kind, why);
            return NULL;
        }
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s", i ? "; " : "", why);
    }
    snprintf(err, errlen, "%s needs the module %s, which did not load (%s); %s, or set %s to its "
             "path", m->needs, m->file, tried, m->build_hint, m->env);
    return NULL;
}
