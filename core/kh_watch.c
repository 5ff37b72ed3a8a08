/* kh_watch.c: the --dev file watch (see kh_watch.h). */
#include "kh_watch.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kh_common.h"
#include "kh_log.h"

typedef struct dir_watch {
    uv_fs_event_t h;
    struct kh_watch *owner;
    struct dir_watch *next;
    int keep; /* kh_watch_set's mark */
    char path[PATH_MAX];
} dir_watch;

struct kh_watch {
    uv_loop_t *loop;
    uv_timer_t debounce;
    uint64_t debounce_ms;
    void (*on_change)(void *ud);
    void *ud;
    dir_watch *dirs;
};

static void debounce_cb(uv_timer_t *t)
{
    kh_watch *w = t->data;
    w->on_change(w->ud);
}

static int is_lua(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n > 4 && strcmp(name + n - 4, ".lua") == 0;
}

static void event_cb(uv_fs_event_t *h, const char *filename, int events, int status)
{
    (void)events;
    dir_watch *d = h->data;
    if (status < 0 || !is_lua(filename))
        return; /* an editor's temporary file, a backup: the rename onto *.lua comes later */
    KH_LOG_DEBUG("dev: %s/%s changed", d->path, filename);
    uv_timer_start(&d->owner->debounce, debounce_cb, d->owner->debounce_ms, 0);
}

kh_watch *kh_watch_new(uv_loop_t *loop, uint64_t debounce_ms, void (*on_change)(void *ud),
                       void *ud)
{
    kh_watch *w = kh_xcalloc(1, sizeof *w);
    w->loop = loop;
    w->debounce_ms = debounce_ms;
    w->on_change = on_change;
    w->ud = ud;
    uv_timer_init(loop, &w->debounce);
    w->debounce.data = w;
    uv_unref((uv_handle_t *)&w->debounce);
    return w;
}

static void dir_free_cb(uv_handle_t *h)
{
    free(h->data);
}

static void mark(kh_watch *w, const char *path, size_t len)
{
    char dir[PATH_MAX], real[PATH_MAX];
    if (len == 0 || len >= sizeof dir)
        return;
    memcpy(dir, path, len);
    dir[len] = '\0';
    if (realpath(dir, real) == NULL)
        return;
    for (dir_watch *d = w->dirs; d; d = d->next)
        if (strcmp(d->path, real) == 0) {
            d->keep = 1;
            return;
        }
    dir_watch *d = kh_xcalloc(1, sizeof *d);
    d->owner = w;
    snprintf(d->path, sizeof d->path, "%s", real);
    uv_fs_event_init(w->loop, &d->h);
    d->h.data = d;
    int r = uv_fs_event_start(&d->h, event_cb, d->path, 0);
    if (r != 0) {
        KH_LOG_WARN("dev: cannot watch %s: %s", d->path, uv_strerror(r));
        uv_close((uv_handle_t *)&d->h, dir_free_cb);
        return;
    }
    uv_unref((uv_handle_t *)&d->h);
    d->keep = 1;
    d->next = w->dirs;
    w->dirs = d;
}

static void mark_file(kh_watch *w, const char *file, size_t len)
{
    const char *slash = NULL;
    for (size_t i = len; i > 0; i--)
        if (file[i - 1] == '/') {
            slash = file + i - 1;
            break;
        }
    if (slash == NULL)
        mark(w, ".", 1);
    else
        mark(w, file, slash == file ? 1 : (size_t)(slash - file));
}

int kh_watch_set(kh_watch *w, const char *files, const char *dir)
{
    for (dir_watch *d = w->dirs; d; d = d->next)
        d->keep = 0;
    if (dir)
        mark(w, dir, strlen(dir));
    for (const char *p = files; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len)
            mark_file(w, p, len);
        p += len + (nl ? 1 : 0);
    }
    int n = 0;
    dir_watch **pp = &w->dirs;
    while (*pp) {
        dir_watch *d = *pp;
        if (!d->keep) {
            *pp = d->next;
            uv_close((uv_handle_t *)&d->h, dir_free_cb);
        } else {
            n++;
            pp = &d->next;
        }
    }
    return n;
}

static void watch_free_cb(uv_handle_t *h)
{
    free(h->data);
}

void kh_watch_free(kh_watch *w)
{
    if (w == NULL)
        return;
    while (w->dirs) {
        dir_watch *d = w->dirs;
        w->dirs = d->next;
        uv_close((uv_handle_t *)&d->h, dir_free_cb);
    }
    uv_close((uv_handle_t *)&w->debounce, watch_free_cb);
}
