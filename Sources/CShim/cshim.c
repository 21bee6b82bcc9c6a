#define _GNU_SOURCE
#include "cshim.h"
#include <errno.h>
#include <pthread.h>
#include <unistd.h>
#include <malloc.h>

int cshim_malloc_trim(void) { return malloc_trim(0); }

int cshim_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    return accept4(fd, addr, len, flags);
}

int cshim_block_signals_fd(const int *signals) {
    sigset_t set;
    sigemptyset(&set);
    for (const int *s = signals; *s != 0; s++) sigaddset(&set, *s);
    int rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (rc != 0) { errno = rc; return -1; }
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

int cshim_read_signal(int sfd) {
    struct signalfd_siginfo info;
    for (;;) {
        ssize_t n = read(sfd, &info, sizeof info);
        if (n == (ssize_t)sizeof info) return (int)info.ssi_signo;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return 0;
        return -1;
    }
}

#include <sys/random.h>

ssize_t cshim_getrandom_nonblocking(void *buf, size_t len) {
    return getrandom(buf, len, GRND_NONBLOCK);
}
