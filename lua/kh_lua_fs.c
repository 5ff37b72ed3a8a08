/* kh_lua_fs.c: file reads for k.static without blocking the loop: core.fs_stat, fs_realpath,
 * fs_read, fs_open, fs_pread run as libuv fs requests on libuv's thread pool and resume the
 * coroutine. fs_open gives a file handle (streamed replies): one fd and one read buffer reused by
 * every fs_pread of the handle, closed by fs_close or by the handle's __gc. fs_sendfile hands a
 * handle's fd to the response (kh_stream_send_file: sendfile on h1 cleartext), when the protocol
 * can take it.
 * Owns:  one kh_lua_fsreq per pending call (its uv_fs_t, path, buffer, open fd), freed when the
 *        last libuv callback of the call ran, even after the coroutine was abandoned; one
 *        kh_lua_file per handle (fd + buffer), freed by __gc/fs_close, or by the pending read's
 *        callback when the handle was collected while a read was in flight.
 * In:    calls from lua/khamsin/static.lua on the worker's thread; libuv fs callbacks.
 * Out:   yields of KH_YIELD (wait KH_WAIT_FS); wakes with true, results... | false, message.
 * Never: calls a blocking file function on the loop; resumes a coroutine itself. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "kh_lua_internal.h"

enum { FS_STAT = 1, FS_REALPATH, FS_READ, FS_OPEN, FS_PREAD };

#define FILE_MT "khamsin.fs_file"

/* An open file of fs_open: the userdata holds a pointer to it, so a read in flight survives the
 * userdata's collection (orphan: the read's callback frees it). */
typedef struct kh_lua_file {
    uv_file fd;
    int busy, orphan;
    size_t cap;
    char *buf;
} kh_lua_file;

static void file_free(kh_lua_file *h)
{
    if (h->fd >= 0) {
        uv_fs_t r;
        uv_fs_close(NULL, &r, h->fd, NULL); /* close(2) of a regular file: does not block */
        uv_fs_req_cleanup(&r);
    }
    free(h->buf);
    free(h);
}

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
    kh_lua_file *file; /* FS_PREAD */
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
    if (f->op == FS_OPEN && f->co) {
        lua_State *co = f->co->co;
        kh_lua_file *h = kh_xcalloc(1, sizeof *h);
        h->fd = f->fd;
        *(kh_lua_file **)lua_newuserdata(co, sizeof h) = h;
        luaL_getmetatable(co, FILE_MT);
        lua_setmetatable(co, -2);
        lua_pushboolean(co, 1);
        lua_insert(co, -2);
        wake(f, 2);
        fsreq_free(f);
        return;
    }
    if (f->co == NULL || f->want == 0) {
        uv_fs_close(&f->K->w->loop, &f->req, f->fd, close_cb);
        return;
    }
    read_more(f);
}

static void pread_cb(uv_fs_t *r)
{
    kh_lua_fsreq *f = r->data;
    ssize_t n = r->result;
    kh_lua_file *h = f->file;
    uv_fs_req_cleanup(r);
    h->busy = 0;
    if (h->orphan) { /* the handle was closed while this read ran */
        file_free(h);
        if (f->co)
            fail(f, UV_EBADF);
    } else if (f->co) {
        if (n < 0) {
            fail(f, (int)n);
        } else {
            lua_State *co = f->co->co;
            lua_pushboolean(co, 1);
            lua_pushlstring(co, h->buf, (size_t)n);
            wake(f, 2);
        }
    }
    fsreq_free(f);
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
            lua_pushnumber(co, (lua_Number)st->st_mtim.tv_nsec);
            lua_pushnumber(co, (lua_Number)st->st_ino);
            lua_pushnumber(co, (lua_Number)st->st_dev);
            wake(f, 7);
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

/* fs_stat(path) -> true, size, mtime, "file"|"dir"|"other", mtime_nsec, ino, dev
 *   | false, message, code (yields)
 * fs_realpath(path) -> true, path | false, message, code (yields)
 * fs_read(path, offset, len) -> true, bytes (fewer when the file is shorter) | false, ... :
 *   opens with O_NOFOLLOW (a last component that is a link is refused: ELOOP)
 * fs_open(path) -> true, handle | false, ... (O_NOFOLLOW too)
 * fs_pread(handle, offset, len) -> true, bytes (fewer at the end of the file) | false, ...:
 *   len at most 1 MiB; the handle's buffer is allocated once (its first read's len) and reused */
static int start(lua_State *L, int op)
{
    kh_lua *K = lua_touserdata(L, lua_upvalueindex(1));
    kh_lua_file *h = NULL;
    if (op == FS_PREAD) {
        kh_lua_file **ph = luaL_checkudata(L, 1, FILE_MT);
        h = *ph;
        if (h == NULL || h->fd < 0)
            return luaL_argerror(L, 1, "the file is closed");
        if (h->busy)
            return luaL_error(L, "fs_pread: a read of this file is in flight");
    }
    const char *path = op == FS_PREAD ? "" : luaL_checkstring(L, 1);
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
    } else if (op == FS_OPEN) {
        r = uv_fs_open(loop, &f->req, f->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0, open_cb);
    } else if (op == FS_PREAD) {
        lua_Number off = luaL_checknumber(L, 2), len = luaL_checknumber(L, 3);
        if (!(off >= 0) || !(len >= 1) || len > 1048576.0) {
            fsreq_free(f);
            return luaL_argerror(L, 3, "offset >= 0 and length: 1 byte to 1 MiB");
        }
        size_t want = (size_t)len;
        if (h->buf == NULL || h->cap < want) {
            free(h->buf);
            h->buf = kh_xcalloc(1, want);
            h->cap = want;
        }
        f->file = h;
        h->busy = 1;
        uv_buf_t b = uv_buf_init(h->buf, (unsigned)want);
        r = uv_fs_read(loop, &f->req, h->fd, &b, 1, (int64_t)off, pread_cb);
        if (r < 0)
            h->busy = 0;
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
static int l_open(lua_State *L) { return start(L, FS_OPEN); }
static int l_pread(lua_State *L) { return start(L, FS_PREAD); }

/* fs_close(handle): closes now (also the handle's __gc); a read in flight finishes first */
static int l_close(lua_State *L)
{
    kh_lua_file **ph = luaL_checkudata(L, 1, FILE_MT);
    kh_lua_file *h = *ph;
    *ph = NULL;
    if (h) {
        if (h->busy)
            h->orphan = 1;
        else
            file_free(h);
    }
    return 0;
}

/* fs_sendfile(s, gen, handle, offset, len) -> true: the response's body is the file's bytes
 * [offset, offset + len) and the response is complete (kh_stream_send_file: sendfile on h1
 * cleartext); the handle's fd went with it (fs_close stays harmless). false: this protocol
 * needs the bytes (TLS, h2, h3, compression): read them with fs_pread and write them. nil,
 * "closed": the client left. */
static int l_sendfile(lua_State *L)
{
    kh_stream *s = lua_touserdata(L, 1);
    if (s == NULL)
        return luaL_argerror(L, 1, "not a request");
    kh_lua_file **ph = luaL_checkudata(L, 3, FILE_MT);
    int64_t off = (int64_t)luaL_checknumber(L, 4);
    double len = luaL_checknumber(L, 5);
    kh_lua_file *h = *ph;
    if (h == NULL || h->busy || h->fd < 0 || off < 0 || len < 0)
        return luaL_error(L, "fs_sendfile: bad handle or range");
    if (s->gen != (uint32_t)lua_tointeger(L, 2) || s->proto == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    int r = kh_stream_send_file(s, h->fd, off, (uint64_t)len, 1);
    if (r == UV_ENOTSUP) {
        lua_pushboolean(L, 0);
        return 1;
    }
    if (r != 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "closed");
        return 2;
    }
    h->fd = -1; /* the protocol's now */
    lua_pushboolean(L, 1);
    return 1;
}

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
        {"fs_stat", l_stat},   {"fs_realpath", l_realpath}, {"fs_read", l_read},
        {"fs_open", l_open},   {"fs_pread", l_pread},       {"fs_close", l_close},
        {"fs_sendfile", l_sendfile},
        {NULL, NULL}};
    if (luaL_newmetatable(L, FILE_MT)) {
        lua_pushcfunction(L, l_close);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, K);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
}
