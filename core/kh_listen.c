/* kh_listen.c: SO_REUSEPORT TCP and UDP sockets (see kh_listen.h).
 * Owns:  the sockets until it returns them in la->fds / la->udp_fds.
 * In:    main.c's parsed --listen addresses.
 * Out:   bound fds; la->port resolved when it was 0.
 * Never: starts accepting or reading (the workers do, kh_accept.c and the QUIC module). */
#include "kh_listen.h"

#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int sockaddr_of(const kh_listen_addr *la, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof *ss);
    int r;
    if (la->family == AF_INET6) {
        r = uv_ip6_addr(la->host, la->port, (struct sockaddr_in6 *)ss);
        *sl = sizeof(struct sockaddr_in6);
    } else {
        r = uv_ip4_addr(la->host, la->port, (struct sockaddr_in *)ss);
        *sl = sizeof(struct sockaddr_in);
    }
    if (r != 0)
        fprintf(stderr, "khamsin: --listen %s: not an IP address\n", la->host);
    return r;
}

/* One reuseport socket of type (SOCK_STREAM | SOCK_DGRAM) bound to la; -1 with errno. */
static int bind_one(kh_listen_addr *la, int type, int *out)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (sockaddr_of(la, &ss, &sl) != 0) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(la->family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0)
        return -1;
    *out = fd;
    if (type == SOCK_STREAM)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
        return -1;
    if (la->family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0)
        return -1;
    return 0;
}

static int *new_fds(int n)
{
    int *fds = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        fds[i] = -1;
    return fds;
}

int kh_listen_tcp(kh_listen_addr *la, int n)
{
    la->fds = new_fds(n);
    for (int i = 0; i < n; i++) {
        if (bind_one(la, SOCK_STREAM, &la->fds[i]) != 0)
            goto fail;
        /* Listen now, not when the worker starts accepting: while the workers load the app, the
         * kernel completes handshakes and queues connections, so a client that connects early is
         * answered as soon as its worker is up instead of being refused and retrying. */
        if (listen(la->fds[i], 4096) != 0)
            goto fail;
        if (la->port == 0) {
            struct sockaddr_storage got;
            socklen_t gl = sizeof got;
            getsockname(la->fds[i], (struct sockaddr *)&got, &gl);
            la->port = ntohs(la->family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                    : ((struct sockaddr_in *)&got)->sin_port);
        }
        continue;
    fail:
        fprintf(stderr, "khamsin: listen on %s:%d: %s\n", la->host, la->port, strerror(errno));
        return -1;
    }
    return 0;
}

/* Steers each QUIC packet to the worker that owns its destination connection ID: the QUIC
 * module puts the worker's id in the first byte of every CID it issues, and a reuseport group
 * picks socket <index> in bind order, which is worker order. The program sees the UDP payload:
 * a short header (bit 0x80 clear) has the DCID at byte 1, a long header at byte 6 (after flags,
 * version and the DCID length). A client's first Initial carries a DCID of its own choosing:
 * its byte mod n picks a worker at random, the same for every retransmission, and that worker's
 * CIDs bring the rest of the connection back to it, from any address (NAT rebinding,
 * migration). The index is taken mod n, so it always names a socket of the group. */
static int attach_cid_router(int fd, int n)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 0),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x80, 2, 0),
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 1), /* short header */
        BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0),
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 6), /* long header */
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, (uint32_t)n),
        BPF_STMT(BPF_RET | BPF_A, 0),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof code / sizeof code[0]), code};
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog);
}

/* n UDP sockets on la->port; -1 with errno (the fds made so far stay in la->udp_fds) */
static int bind_udp(kh_listen_addr *la, int n)
{
    la->udp_fds = new_fds(n);
    for (int i = 0; i < n; i++)
        if (bind_one(la, SOCK_DGRAM, &la->udp_fds[i]) != 0)
            return -1;
    return 0;
}

static int route(kh_listen_addr *la, int n)
{
    if (n > 1 && attach_cid_router(la->udp_fds[0], n) != 0)
        fprintf(stderr, "khamsin: %s:%d (quic): no CID routing between workers (%s): a client "
                "whose address changes may lose its connection\n", la->host, la->port,
                strerror(errno));
    return 0;
}

int kh_listen_udp(kh_listen_addr *la, int n)
{
    if (bind_udp(la, n) != 0) {
        fprintf(stderr, "khamsin: listen on %s:%d (quic): %s\n", la->host, la->port,
                strerror(errno));
        return -1;
    }
    return route(la, n);
}

int kh_listen_pair(kh_listen_addr *la, int n, int udp)
{
    int any = la->port == 0;
    for (int attempt = 1;; attempt++) {
        if (kh_listen_tcp(la, n) != 0)
            return -1;
        if (!udp)
            return 0;
        /* the kernel picked the TCP port without looking at UDP: a client's ephemeral UDP
         * socket may hold the same number; then take another pair (`:0` only) */
        if (any && attempt < KH_LISTEN_PAIR_ATTEMPTS) {
            if (bind_udp(la, n) == 0)
                return route(la, n);
            if (errno != EADDRINUSE)
                goto fail;
            kh_listen_close(la, n);
            la->port = 0;
            continue;
        }
        return kh_listen_udp(la, n);
    fail:
        fprintf(stderr, "khamsin: listen on %s:%d (quic): %s\n", la->host, la->port,
                strerror(errno));
        return -1;
    }
}

void kh_listen_close(kh_listen_addr *la, int n)
{
    for (int j = 0; j < n; j++) {
        if (la->fds && la->fds[j] >= 0)
            close(la->fds[j]);
        if (la->udp_fds && la->udp_fds[j] >= 0)
            close(la->udp_fds[j]);
    }
    free(la->fds);
    free(la->udp_fds);
    la->fds = la->udp_fds = NULL;
}
