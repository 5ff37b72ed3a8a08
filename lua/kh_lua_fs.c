/* kh_lua_fs.c: file reads for k.static without blocking the loop: core.fs_stat, fs_realpath,
 * fs_read run as libuv fs requests on libuv's thread pool and resume the coroutine.
 * Owns:  one kh_lua_fsreq per pending call (its uv_fs_t, path, buffer, open fd), freed when the
 *        last libuv callback of the call ran, even after the coroutine was abandoned.
 * In:    calls from lua/khamsin/static.lua on the worker's thread; libuv fs callbacks.
 * Out:   yields of KH_YIELD (wait KH_WAIT_FS); wakes with true, results... | false, message.
 * Never: calls a blocking file function on the loop; resumes a coroutine itself. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "kh_lua_internal.h"

enum { FS_STAT = 1, FS_REALPATH, FS_READ };

struct kh_lua_fsreq {
    uv_fs_t req;
    kh_lua *K;
    kh_lua_co *co; /* NULL once abandoned (the request ended while we waited) */
    int op;
    uv_file fd;
    char *path;
    char *buf;
    size_t want, got;
    int64_t offset;
};

static void fsreq_free(kh_lua_fsreq *f)
{
    free(f->path);
    free(f->buf);
    free(f);
}

static void wake(kh_lua_fsreq *f, int n)
{
    kh_lua_co *c = f->co;
    f->co = NULL; /* answered: later callbacks of this call only clean up */
    c->fs = NULL;
    c->wait = KH_WAIT_NONE;
    kh__lua_wake(f->K, c, n);
}

static void fail(kh_lua_fsreq *f, int err)
{
    lua_State *co = f->co->co;
    lua_pushboolean(co, 0);
    lua_pushstring(co, uv_strerror(err));
    lua_pushstring(co, uv_err_name(err));
    wake(f, 3);
}

static void close_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    uv_fs_req_cleanup(r);
    if (f->co) {
        lua_State *co = f->co->co;
        lua_pushboolean(co, 1);
        lua_pushlstring(co, f->buf, f->got);
        wake(f, 2);
    }
    fsreq_free(f);
}

static void read_cb(uv_fs_t *r);

static void read_more(kh_lua_fsreq *f)
{
    uv_buf_t b = uv_buf_init(f->buf + f->got, (unsigned)(f->want - f->got));
    uv_fs_read(&f->K->w->loop, &f->req, f->fd, &b, 1, f->offset + (int64_t)f->got, read_cb);
}

static void read_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    ssize_t n = r->result;
    uv_fs_req_cleanup(r);
    if (n > 0 && f->co) {
        f->got += (size_t)n;
        if (f->got < f->want) {
            read_more(f);
            return;
        }
    } else if (n < 0 && f->co) {
        fail(f, (int)n);
    }
    /* done, end of file (the file shrank: got < want, the caller checks), error or abandoned */
    uv_fs_close(&f->K->w->loop, &f->req, f->fd, close_cb);
}

static void open_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    ssize_t fd = r->result;
    uv_fs_req_cleanup(r);
    if (fd < 0) {
        if (f->co)
            fail(f, (int)fd);
        fsreq_free(f);
        return;
    }
    f->fd = (uv_file)fd;
    if (f->co == NULL || f->want == 0) {
        uv_fs_close(&f->K->w->loop, &f->req, f->fd, close_cb);
        return;
    }
    read_more(f);
}

static void stat_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    if (f->co) {
        if (r->result < 0) {
            fail(f, (int)r->result);
        } else {
            lua_State *co = f->co->co;
            const uv_stat_t *st = &r->statbuf;
            lua_pushboolean(co, 1);
            lua_pushnumber(co, (lua_Number)st->st_size);
            lua_pushnumber(co, (lua_Number)st->st_mtim.tv_sec);
            lua_pushstring(co, S_ISDIR(st->st_mode) ? "dir" : S_ISREG(st->st_mode) ? "file"
                                                                                  : "other");
            wake(f, 4);
        }
    }
    uv_fs_req_cleanup(r);
    fsreq_free(f);
}

static void realpath_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    if (f->co) {
        if (r->result < 0) {
            fail(f, (int)r->result);
        } else {
            lua_pushboolean(f->co->co, 1);
            lua_pushstring(f->co->co, r->ptr);
            wake(f, 2);
        }
    }
    uv_fs_req_cleanup(r);
    fsreq_free(f);
}

/* fs_stat(path) -> true, size, mtime, "file"|"dir"|"other" | false, message, code (yields)
 * fs_realpath(path) -> true, path | false, message, code (yields)
 * fs_read(path, offset, len) -> true, bytes (fewer when the file is shorter) | false, ... :
 *   opens with O_NOFOLLOW (a last component that is a link is refused: ELOOP) */
static int start(lua_State *L, int op)
{
    kh_lua *K = lua_touserdata(L, lua_upvalueindex(1));
    const char *path = luaL_checkstring(L, 1);
    kh_lua_co *c = K->current;
    if (c == NULL || c->wait != KH_WAIT_NONE)
        return luaL_error(L, "file reads wait in a handler, one at a time");
    if (c->aborted) {
        lua_pushboolean(L, 0);
        lua_pushliteral(L, "aborted");
        lua_pushliteral(L, "aborted");
        return 3;
    }
    kh_lua_fsreq *f = kh_xcalloc(1, sizeof *f);
    f->K = K;
    f->co = c;
    f->op = op;
    f->fd = -1;
    f->path = strdup(path);
    f->req.data = f;
    int r;
    uv_loop_t *loop = &K->w->loop;
    if (op == FS_STAT) {
        r = uv_fs_stat(loop, &f->req, f->path, stat_cb);
    } else if (op == FS_REALPATH) {
        r = uv_fs_realpath(loop, &f->req, f->path, realpath_cb);
    } else {
        lua_Number off = luaL_checknumber(L, 2), len = luaL_checknumber(L, 3);
        if (!(off >= 0) || !(len >= 0) || len > 1073741824.0) {
            fsreq_free(f);
            return luaL_argerror(L, 3, "offset and length: 0 to 1 GiB");
        }
        f->offset = (int64_t)off;
        f->want = (size_t)len;
        f->buf = kh_xcalloc(1, f->want ? f->want : 1);
        r = uv_fs_open(loop, &f->req, f->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0, open_cb);
    }
    if (r < 0) {
        fsreq_free(f);
        lua_pushboolean(L, 0);
        lua_pushstring(L, uv_strerror(r));
        lua_pushstring(L, uv_err_name(r));
        return 3;
    }
    c->fs = f;
    c->wait = KH_WAIT_FS;
    lua_pushlightuserdata(L, KH_YIELD);
    return lua_yield(L, 1);
}

static int l_stat(lua_State *L) { return start(L, FS_STAT); }
static int l_realpath(lua_State *L) { return start(L, FS_REALPATH); }
static int l_read(lua_State *L) { return start(L, FS_READ); }

void kh__lua_fs_abandon(kh_lua_co *c)
{
    if (c->fs) {
        c->fs->co = NULL; /* the callbacks free it; an open file is closed */
        c->fs = NULL;
    }
}

void kh__lua_open_fs(lua_State *L, kh_lua *K)
{
    static const luaL_Reg fns[] = {
        {"fs_stat", l_stat}, {"fs_realpath", l_realpath}, {"fs_read", l_read}, {NULL, NULL}};
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
}
