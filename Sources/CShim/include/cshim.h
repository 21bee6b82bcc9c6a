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

// The kernel calls of the connection hand-over across restarts, in handover.c:
// memfd_create(2) and its seals (GNU-only), and sendmsg(2)/recvmsg(2) with
// SCM_RIGHTS (the CMSG_* macros do not import).

/// SCM_MAX_FD: the most descriptors one sendmsg(2) may carry (254 gives EINVAL
/// on this kernel with 253 measured as the working maximum).
#define CSHIM_MAX_FDS_PER_MESSAGE 253

/// memfd_create(2) with MFD_CLOEXEC | MFD_ALLOW_SEALING; -1 with errno set.
int cshim_memfd_create(const char *name);

/// getrandom(2) with GRND_NONBLOCK: -1 with errno EAGAIN while the kernel's
/// pool is not initialised yet (early boot), instead of blocking.
ssize_t cshim_getrandom_nonblocking(void *buf, size_t len);

/// Seals a memfd against every further change (F_SEAL_SHRINK, F_SEAL_GROW,
/// F_SEAL_WRITE, F_SEAL_SEAL); 0, or -1 with errno set.
int cshim_memfd_seal(int fd);

/// The bytes of a socket's send queue not yet acknowledged by the peer
/// (ioctl(2) SIOCOUTQ, tcp(7), unix(7)); -1 with errno set.
int cshim_unsent_bytes(int fd);

/// One sendmsg(2) of `len` bytes of `data` carrying `nfds` descriptors
/// (SCM_RIGHTS, 0 <= nfds <= CSHIM_MAX_FDS_PER_MESSAGE), to `addr` when it is
/// not NULL. Returns the bytes sent, or -1 with errno set (EINTR is retried).
ssize_t cshim_send_fds(int sock, const struct sockaddr *addr, socklen_t addrlen,
                       const void *data, size_t len, const int *fds, int nfds, int flags);

/// One recvmsg(2) into `data` (at most `len` bytes) and up to `maxfds`
/// descriptors, received close-on-exec. `*nfds` gets the number received and
/// `*truncated` is set when the kernel had more descriptors than fitted
/// (MSG_CTRUNC: those are closed by the kernel). Returns the bytes received
/// (0 at end of stream), or -1 with errno set (EINTR is retried).
ssize_t cshim_recv_fds(int sock, void *data, size_t len, int *fds, int maxfds, int *nfds, int *truncated, int flags);

#endif
