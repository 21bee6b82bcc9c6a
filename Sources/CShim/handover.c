#define _GNU_SOURCE
#include "cshim.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

int cshim_memfd_create(const char *name) {
    return memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

int cshim_memfd_seal(int fd) {
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
}

ssize_t cshim_send_fds(int sock, const struct sockaddr *addr, socklen_t addrlen,
                       const void *data, size_t len, const int *fds, int nfds, int flags) {
    if (nfds < 0 || nfds > CSHIM_MAX_FDS_PER_MESSAGE) { errno = EINVAL; return -1; }
    union {
        char buf[CMSG_SPACE(sizeof(int) * CSHIM_MAX_FDS_PER_MESSAGE)];
        struct cmsghdr align;
    } control;
    struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
    struct msghdr msg = {
        .msg_name = (void *)addr, .msg_namelen = addr ? addrlen : 0,
        .msg_iov = &iov, .msg_iovlen = 1,
    };
    if (nfds > 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        return n;
    }
}

ssize_t cshim_recv_fds(int sock, void *data, size_t len, int *fds, int maxfds, int *nfds, int *truncated, int flags) {
    union {
        char buf[CMSG_SPACE(sizeof(int) * CSHIM_MAX_FDS_PER_MESSAGE)];
        struct cmsghdr align;
    } control;
    if (maxfds > CSHIM_MAX_FDS_PER_MESSAGE) maxfds = CSHIM_MAX_FDS_PER_MESSAGE;
    struct iovec iov = { .iov_base = data, .iov_len = len };
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1,
        .msg_control = control.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)(maxfds > 0 ? maxfds : 1)),
    };
    *nfds = 0;
    *truncated = 0;
    ssize_t n;
    for (;;) {
        n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        break;
    }
    if (n < 0) return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *received = (int *)CMSG_DATA(c);
        for (int i = 0; i < count; i++) {
            if (*nfds < maxfds) fds[(*nfds)++] = received[i];
            else { close(received[i]); *truncated = 1; }
        }
    }
    if (msg.msg_flags & MSG_CTRUNC) *truncated = 1;
    return n;
}

#include <sys/ioctl.h>
#include <linux/sockios.h>

int cshim_unsent_bytes(int fd) {
    int n = 0;
    return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : -1;
}
