/* bench/lib/hello_floor.c: the keep-alive floor of bench/http1.sh (issue 15 item 3). The least
 * any server on this box can do per keep-alive request: one epoll loop, edge-triggered as
 * nginx's (libuv's, and so khamsin's, is level-triggered: the kernel polls each reported socket
 * again at the next epoll_wait), one read() per ready connection and one write() of a fixed
 * 200 "Hello, World!" (the 13 bytes of bench/apps/hello.lua) for each read that returned bytes,
 * with no parsing, no Date header, no timers, no allocation. wrk sends the next request only
 * after the answer, so one read is one request (a full buffer is read again: edge-triggered).
 * Its req per server CPU-second over nginx + lua's, in the same run, is the ceiling of the ratio
 * any server has here.
 *   cc -O2 -o hello_floor bench/lib/hello_floor.c && ./hello_floor 23084 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 511) != 0)
        return 1;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0)
        return 1;
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: 13\r\n\r\nHello, World!";
    static char buf[16384];
    struct epoll_event evs[512];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event cev = {.events = EPOLLIN | EPOLLET, .data.fd = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0)
                        close(c);
                }
                continue;
            }
            ssize_t r;
            while ((r = read(fd, buf, sizeof buf)) > 0) {
                if (write(fd, resp, sizeof resp - 1) != (ssize_t)(sizeof resp - 1)) {
                    r = 0; /* a full socket buffer: wrk never gets there */
                    break;
                }
                if (r < (ssize_t)sizeof buf)
                    break; /* a short read: the socket is drained until its next edge */
            }
            if (r == 0 || (r < 0 && errno != EAGAIN))
                close(fd); /* closing drops it from the epoll set */
        }
    }
}
