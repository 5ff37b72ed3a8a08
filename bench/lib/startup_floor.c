/* bench/lib/startup_floor.c: the second floor of bench/startup.sh (issue 15 item 5). The least
 * a server can do between exec and its first answer, polled the same way khamsin is: a C
 * program (dynamically linked against glibc, as cc builds it) that binds and listens on
 * 127.0.0.1:PORT, accepts, reads a request head and answers a fixed 200 "Hello, World!" (the
 * same 13 bytes as bench/apps/hello.lua), then accepts the next one. With --once it exits after
 * its first answer (the counts of bench/startup.sh's PARTS=counts: faults and syscalls from exec
 * to the first answer, like bench/apps/first_answer.lua for khamsin).
 *   cc -O2 -o startup_floor bench/lib/startup_floor.c && ./startup_floor 23290 [--once] */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: 13\r\n\r\nHello, World!";
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
        ssize_t w = write(c, resp, sizeof resp - 1);
        (void)w;
        if (once)
            _exit(0);
        close(c);
    }
}
