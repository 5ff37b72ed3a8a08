/* bench/lib/startup_floor_lua.c: the Lua floor of bench/startup.sh (floor-lua; issue 15 item 5).
 * What any engine embedding LuaJIT pays between exec and its first answer: bench/lib/
 * startup_floor.c's server (listen on 127.0.0.1:PORT, accept, read a request head, answer a
 * 200) that, once listening, creates a lua_State, opens the standard libraries and loads a
 * one-line hello handler, and answers each request with what calling that handler returns (the
 * same 13 bytes as bench/apps/hello.lua). Linked as KH_STATIC_DEPS links khamsin: the static
 * LuaJIT (libluajit-5.1.a) and libgcc (bench/startup.sh builds it with cc). With --once it exits
 * after its first answer (PARTS=counts / ir).
 *   cc -O2 -static-libgcc -I/usr/include/luajit-2.1 -o startup_floor_lua \
 *      bench/lib/startup_floor_lua.c /usr/lib/x86_64-linux-gnu/libluajit-5.1.a -lm -ldl
 *   ./startup_floor_lua 23290 [--once] */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

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
    lua_State *L = luaL_newstate();
    if (L == NULL)
        return 1;
    luaL_openlibs(L);
    static const char app[] = "return function(req) return 'Hello, World!' end";
    if (luaL_loadbuffer(L, app, sizeof app - 1, "=hello") != 0 || lua_pcall(L, 0, 1, 0) != 0)
        return 1;
    int handler = luaL_ref(L, LUA_REGISTRYINDEX);
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
        (void)w;
        if (once)
            _exit(0);
        close(c);
    }
}
