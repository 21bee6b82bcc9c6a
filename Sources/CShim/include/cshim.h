// C declarations Glibc's Swift overlay does not expose.
// _GNU_SOURCE is deliberately NOT defined here: it breaks debug builds
// (accept4 then takes a transparent union Swift cannot pass); GNU-only
// calls are wrapped in cshim.c instead.
#ifndef ROOMCAST_CSHIM_H
#define ROOMCAST_CSHIM_H

#include <sys/types.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <signal.h>
#include <getopt.h>

/// accept4(2) with SOCK_NONBLOCK|SOCK_CLOEXEC style flags.
int cshim_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);

/// Size in bytes of struct signalfd_siginfo (128).
static inline int cshim_signalfd_siginfo_size(void) { return (int)sizeof(struct signalfd_siginfo); }

/// Blocks `signals` (a 0-terminated list) in the calling thread and returns a
/// non-blocking, close-on-exec signalfd for them, or -1 with errno set.
int cshim_block_signals_fd(const int *signals);

/// Reads one pending signal from a signalfd: the signal number, 0 when none is
/// pending (EAGAIN), -1 with errno set on error.
int cshim_read_signal(int sfd);

/// malloc_trim(3): gives free heap pages back to the kernel; returns 1 if
/// memory was released. (<malloc.h> is not in Glibc's Swift module.)
int cshim_malloc_trim(void);

#endif
