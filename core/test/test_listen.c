/* test_listen.c: unit tests for kh_listen_pair (TAP): a `:0` TCP+UDP pair whose UDP bind finds
 * the port taken is retried on a new port, a fixed port is not, and a really taken UDP port fails.
 * Owns:  a bind() of its own that fails the next N UDP binds with EADDRINUSE (the binary's
 *        definition takes precedence over libc's for kh_listen.c; the rest go to the syscall).
 * In:    -
 * Out:   TAP lines; exit status 0 when every assertion holds.
 * Never: talks to anything but 127.0.0.1. */
#include "kh_listen.h"
#include "kh_test.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>

static int fail_udp, udp_binds, tcp_binds;

int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
    int type = 0;
    socklen_t tl = sizeof type;
    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl);
    if (type == SOCK_DGRAM) {
        udp_binds++;
        if (fail_udp > 0) {
            fail_udp--;
            errno = EADDRINUSE;
            return -1;
        }
    } else {
        tcp_binds++;
    }
    return (int)syscall(SYS_bind, fd, sa, len);
}

static int port_of(int fd)
{
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &l) != 0)
        return -1;
    return ntohs(a.sin_port);
}

static kh_listen_addr addr(int port)
{
    kh_listen_addr la;
    memset(&la, 0, sizeof la);
    strcpy(la.host, "127.0.0.1");
    la.family = AF_INET;
    la.port = port;
    la.tls = 1;
    return la;
}

int main(void)
{
    /* `:0`, two workers, the first two UDP binds find the port taken: a third pair is made */
    kh_listen_addr la = addr(0);
    fail_udp = 2;
    udp_binds = tcp_binds = 0;
    kh_is_int(kh_listen_pair(&la, 2, 1), 0, ":0 with two taken UDP ports: a pair");
    kh_is_int(udp_binds, 4, "two failed UDP binds, then one per worker");
    kh_is_int(tcp_binds, 6, "three TCP pairs bound (one per worker each time)");
    kh_ok(la.port > 0 && la.fds && la.udp_fds, "port %d, fds set", la.port);
    for (int i = 0; i < 2; i++) {
        kh_is_int(port_of(la.fds[i]), la.port, "TCP socket %d on the port", i);
        kh_is_int(port_of(la.udp_fds[i]), la.port, "UDP socket %d on the same port", i);
    }
    kh_listen_close(&la, 2);

    /* `:0` and every attempt fails: an error, nothing left open */
    la = addr(0);
    fail_udp = 1000;
    udp_binds = 0;
    kh_is_int(kh_listen_pair(&la, 1, 1), -1, ":0 and every UDP bind fails: -1");
    kh_is_int(udp_binds, KH_LISTEN_PAIR_ATTEMPTS, "after KH_LISTEN_PAIR_ATTEMPTS tries");
    kh_listen_close(&la, 1);

    /* a port given by the user is not changed behind its back */
    la = addr(0);
    fail_udp = 0;
    kh_is_int(kh_listen_pair(&la, 1, 0), 0, "a TCP-only :0 listener");
    int fixed = la.port;
    kh_listen_close(&la, 1);
    la = addr(fixed);
    fail_udp = 1;
    udp_binds = 0;
    kh_is_int(kh_listen_pair(&la, 1, 1), -1, "a fixed port whose UDP bind fails: -1");
    kh_is_int(udp_binds, 1, "no retry on a fixed port");
    kh_is_int(la.port, fixed, "the port is kept");
    kh_listen_close(&la, 1);

    /* a UDP port really taken (by a socket without SO_REUSEPORT), without the fake failures */
    fail_udp = 0;
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    kh_ok(u >= 0 && syscall(SYS_bind, u, (struct sockaddr *)&a, sizeof a) == 0, "a UDP socket");
    la = addr(port_of(u));
    kh_is_int(kh_listen_pair(&la, 1, 1), -1, "UDP port %d held by another socket: -1", la.port);
    kh_listen_close(&la, 1);
    close(u);
    return kh_test_done();
}
