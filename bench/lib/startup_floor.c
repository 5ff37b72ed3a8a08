/* bench/lib/startup_floor.c: the server floors of bench/startup.sh (issue 15 item 5).
 * floor-server: the least a server can do between exec and its first answer, polled the same
 * way khamsin is: a C program (dynamically linked against glibc, as cc builds it) that binds and
 * listens on 127.0.0.1:PORT, accepts, reads a request head and answers a fixed 200
 * "Hello, World!" (the same 13 bytes as bench/apps/hello.lua), then accepts the next one.
 * floor-lua (built with -DKH_FLOOR_LUA): what any engine embedding LuaJIT pays on top: once
 * listening, the same server creates a lua_State, opens the standard libraries and loads a
 * one-line hello handler, and answers each request with what calling that handler returns.
 * Linked as KH_STATIC_DEPS links khamsin: the static LuaJIT (libluajit-5.1.a) and libgcc.
 * With --once either exits after its first answer (the counts of bench/startup.sh's
 * PARTS=counts / ir: faults and syscalls from exec to the first answer, like
 * bench/apps/first_answer.lua for khamsin).
 *   cc -O2 -o startup_floor bench/lib/startup_floor.c && ./startup_floor 23290 [--once]
 *   cc -O2 -DKH_FLOOR_LUA -static-libgcc -I/usr/include/luajit-2.1 -o startup_floor_lua \
 *      bench/lib/startup_floor.c /usr/lib/x86_64-linux-gnu/libluajit-5.1.a -lm -ldl */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef KH_FLOOR_LUA
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#endif

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int once = argc > 2 && strcmp(argv[2], "--once") == 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0)
        return 1;
#ifdef KH_FLOOR_LUA
    lua_State *L = luaL_newstate();
    if (L == NULL)
        return 1;
    luaL_openlibs(L);
    static const char app[] = "return function(req) return 'Hello, World!' end";
    if (luaL_loadbuffer(L, app, sizeof app - 1, "=hello") != 0 || lua_pcall(L, 0, 1, 0) != 0)
        return 1;
    int handler = luaL_ref(L, LUA_REGISTRYINDEX);
#else
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: 13\r\n\r\nHello, World!";
#endif
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        char buf[4096];
        size_t n = 0;
        while (n < sizeof buf - 1) { /* up to the end of the head */
            ssize_t r = read(c, buf + n, sizeof buf - 1 - n);
            if (r <= 0)
                break;
            n += (size_t)r;
            buf[n] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
#ifdef KH_FLOOR_LUA
        lua_rawgeti(L, LUA_REGISTRYINDEX, handler);
        lua_pushnil(L); /* req */
        size_t blen = 0;
        const char *body = NULL;
        if (lua_pcall(L, 1, 1, 0) == 0)
            body = lua_tolstring(L, -1, &blen);
        char resp[256];
        int m = snprintf(resp, sizeof resp,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu"
                         "\r\n\r\n%.*s", blen, (int)blen, body ? body : "");
        lua_settop(L, 0);
        ssize_t w = write(c, resp, (size_t)m);
#else
        ssize_t w = write(c, resp, sizeof resp - 1);
#endif
        (void)w;
        if (once)
            _exit(0);
        close(c);
    }
}
