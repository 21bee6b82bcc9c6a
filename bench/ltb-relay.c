/*
 * ltb-relay: the yardstick of BENCHMARKS.md. A minimal relay of the LTB
 * protocol (docs/protocol/ltb.md §1): one thread, level-triggered epoll, no
 * rooms, no validation, one shared batch per loop pass. It is as little work
 * per delivery as a relay on this machine can do, so roomcastd's throughput
 * divided by its throughput says how far roomcastd is from the practical
 * limit, with everything else (kernel, loopback, generator) the same.
 *
 *   ltb-relay [--echo] PORT      listens on 127.0.0.1:PORT; SIGTERM/SIGINT stop it
 *
 * One loop pass: epoll_pwait; accept (at most 64 per wake-up); read every
 * ready client (at most 4 reads of 64 KiB, as roomcastd) straight into the
 * pass's shared batch, keeping whole frames there and a trailing partial
 * frame in the client's own carry buffer; then write the batch to every
 * client with ONE writev(2). Only what the kernel refuses is copied, into
 * that client's backlog, which goes out first (EPOLLOUT armed while there is
 * one). So a frame is copied by the kernel once per recipient and by us not
 * at all, unless a recipient is behind.
 *
 * Relay semantics, as the bench workloads need them from roomcastd with
 * bench/roomcastd-bench.conf: every frame goes to every client byte for byte
 * in the order it arrived, joins (type 0) included, heartbeats (type 8)
 * never; and, like `echo = no`, not back to its sender. A sender's frames of
 * one pass are one contiguous range of the batch (its reads are consecutive),
 * so leaving them out costs no copy: the sender gets the batch before and
 * after its range, two iovecs of the same single writev. `--echo` sends
 * everyone the whole batch (a generator run with `--echo yes` ignores its own
 * frames); BENCHMARKS.md has the measurement of both.
 *
 * Build: gcc -O2 -o ltb-relay ltb-relay.c (make bench does it).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    HEADER = 6,                 /* u32 LE body length, u16 LE type */
    TYPE_HEARTBEAT = 8,         /* proof of life only: never relayed */
    READ_SIZE = 64 * 1024,      /* as roomcastd (Input.readSize) */
    READS_PER_WAKEUP = 4,       /* as roomcastd (Input.readsPerWakeup) */
    ACCEPTS_PER_WAKEUP = 64,    /* as roomcastd: a storm never stalls a pass */
    MAX_EVENTS = 1024,
    /* roomcastd sets SO_SNDBUF to 64 KiB (the kernel doubles it) so that a
     * slow reader's backlog builds up in its own output buffer, where its
     * output limits see it. The same here: with autotuning (up to 4 MiB per
     * socket) the kernel would absorb backlogs that roomcastd has to copy,
     * and the relay would look faster for a reason roomcastd cannot use. */
    SEND_BUFFER = 64 * 1024,
    MAX_FRAME = 64 * 1024,      /* bench config: max_frame_bytes = 64K */
    MAX_BACKLOG = 64 << 20,     /* bench config: output_hard_bytes = 64M */
    /* Stop reading new clients in a pass once the batch holds this much
     * (level-triggered: they are reported again next pass). Bounds memory
     * and the time one pass can take. */
    BATCH_SOFT_LIMIT = 4 << 20,
    MAX_CLIENTS = 19900,        /* bench config: max_clients */
};

struct buf {
    char *p;
    size_t off, len, cap;       /* live bytes: p[off .. len) */
};

struct client {
    int fd;
    int closing;                /* reaped at the end of the pass, never inside it */
    int armed;                  /* EPOLLOUT registered: the backlog is not empty */
    size_t at;                  /* index in clients[] */
    struct buf carry;           /* a partial frame between reads */
    struct buf backlog;         /* what the kernel refused, written first */
    uint64_t own_pass;          /* the pass of own_start/own_end */
    size_t own_start, own_end;  /* this pass's frames from this client in the batch */
};

static struct client **clients;
static size_t nclients;
static struct buf batch;
static uint64_t pass;
static int ep, echo_all;
static volatile sig_atomic_t stopping;

/* What the run did, printed at exit (copies per delivery for BENCHMARKS.md). */
static struct {
    uint64_t passes, frames, heartbeats, writes, bytes_written, bytes_backlogged, closed_slow;
} stats;

static void die(const char *what) { perror(what); exit(1); }

static void on_signal(int sig) { (void)sig; stopping = 1; }

/* Room for `n` more bytes after buf->len (compacts consumed bytes first). */
static void reserve(struct buf *b, size_t n) {
    if (b->off > 0 && b->off == b->len) b->off = b->len = 0;
    if (b->len + n <= b->cap) return;
    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + n <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) die("realloc");
    b->cap = cap;
}

static void append(struct buf *b, const void *p, size_t n) {
    reserve(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* `why`: logged (NULL: an ordinary end, such as the generator's RST). */
static void close_later(struct client *c, const char *why) {
    if (c->closing) return;
    c->closing = 1;
    if (why) fprintf(stderr, "ltb-relay: closing fd %d: %s\n", c->fd, why);
}

static void set_write_interest(struct client *c, int on) {
    if (c->armed == on) return;
    struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl MOD");
    c->armed = on;
}

/* EPOLLOUT: write the backlog; disarm once it is gone. */
static void write_backlog(struct client *c) {
    struct buf *b = &c->backlog;
    while (b->len > b->off) {
        ssize_t n = write(c->fd, b->p + b->off, b->len - b->off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n < 0) { close_later(c, errno == ECONNRESET || errno == EPIPE ? NULL : strerror(errno)); return; }
        stats.writes++;
        stats.bytes_written += (uint64_t)n;
        b->off += (size_t)n;
    }
    b->off = b->len = 0;
    set_write_interest(c, 0);
}

/* Whole frames of `have` bytes at `base`: heartbeats cut out (the rest moved
 * down over them: rare, one per connection per 10 s), the kept length
 * returned, `*used` set to the bytes consumed. -1: a frame over MAX_FRAME. */
static long cut_frames(char *base, size_t have, size_t *used) {
    size_t r = 0, w = 0;
    while (have - r >= HEADER) {
        uint32_t len; uint16_t type;
        memcpy(&len, base + r, 4);
        memcpy(&type, base + r + 4, 2);
        len = le32toh(len);
        type = le16toh(type);
        if (len > MAX_FRAME) return -1;
        size_t size = HEADER + (size_t)len;
        if (have - r < size) break;
        if (type == TYPE_HEARTBEAT) {
            stats.heartbeats++;
        } else {
            if (w != r) memmove(base + w, base + r, size);
            w += size;
            stats.frames++;
        }
        r += size;
    }
    *used = r;
    return (long)w;
}

/* Reads what `c` sent straight into the batch, bounded per wake-up. */
static void read_client(struct client *c) {
    for (int i = 0; i < READS_PER_WAKEUP; i++) {
        size_t keep = c->carry.len;
        reserve(&batch, keep + READ_SIZE);
        size_t start = batch.len;
        ssize_t n = read(c->fd, batch.p + start + keep, READ_SIZE);
        if (n < 0 && errno == EINTR) { i--; continue; }
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) { close_later(c, n == 0 || errno == ECONNRESET ? NULL : strerror(errno)); return; }
        /* The partial frame kept from before goes in front of the new bytes. */
        if (keep > 0) memcpy(batch.p + start, c->carry.p, keep);
        c->carry.len = 0;
        size_t used;
        long kept = cut_frames(batch.p + start, keep + (size_t)n, &used);
        if (kept < 0) { close_later(c, "frame over 64 KiB"); return; }
        if (used < keep + (size_t)n) append(&c->carry, batch.p + start + used, keep + (size_t)n - used);
        if (c->own_pass != pass) { c->own_pass = pass; c->own_start = start; }
        batch.len = start + (size_t)kept;
        c->own_end = batch.len;
        if (n < READ_SIZE) return;
    }
}

/* The end of a pass: the batch to `c`, one writev; the refused rest copied. */
static void deliver(struct client *c) {
    struct iovec iov[2];
    int cnt = 0;
    if (!echo_all && c->own_pass == pass && c->own_end > c->own_start) {
        if (c->own_start > 0) iov[cnt++] = (struct iovec){ batch.p, c->own_start };
        if (c->own_end < batch.len) iov[cnt++] = (struct iovec){ batch.p + c->own_end, batch.len - c->own_end };
    } else {
        iov[cnt++] = (struct iovec){ batch.p, batch.len };
    }
    if (cnt == 0) return;
    size_t total = iov[0].iov_len + (cnt > 1 ? iov[1].iov_len : 0);
    size_t done = 0;
    if (c->backlog.len == c->backlog.off) {
        ssize_t n;
        do n = writev(c->fd, iov, cnt); while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN) {
            close_later(c, errno == ECONNRESET || errno == EPIPE ? NULL : strerror(errno));
            return;
        }
        if (n > 0) { stats.writes++; stats.bytes_written += (uint64_t)n; done = (size_t)n; }
    }
    if (done == total) return;
    /* The kernel refused the rest (or there is a backlog already: the bytes
     * queue behind it, in order). */
    if (c->backlog.len - c->backlog.off + (total - done) > MAX_BACKLOG) {
        stats.closed_slow++;
        close_later(c, "slow consumer: backlog over 64 MiB");
        return;
    }
    stats.bytes_backlogged += total - done;
    for (int k = 0; k < cnt; k++) {
        if (done >= iov[k].iov_len) { done -= iov[k].iov_len; continue; }
        append(&c->backlog, (char *)iov[k].iov_base + done, iov[k].iov_len - done);
        done = 0;
    }
    set_write_interest(c, 1);
}

static void accept_some(int lfd) {
    for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN) perror("ltb-relay: accept4");
            return;
        }
        if (nclients >= MAX_CLIENTS) { close(fd); continue; }
        int one = 1, sndbuf = SEND_BUFFER;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        struct client *c = calloc(1, sizeof *c);
        if (!c) die("calloc");
        c->fd = fd;
        c->at = nclients;
        clients[nclients++] = c;
        struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl ADD");
    }
}

/* Frees the clients marked closing. Only here, after every event of the pass
 * is handled, so no event of this pass can name a freed client; and close(2)
 * takes the fd out of the epoll set, so no later event can either. */
static void reap(void) {
    for (size_t i = 0; i < nclients;) {
        struct client *c = clients[i];
        if (!c->closing) { i++; continue; }
        close(c->fd);
        free(c->carry.p);
        free(c->backlog.p);
        clients[i] = clients[--nclients];
        clients[i]->at = i;
        free(c);
    }
}

static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);   /* loopback only */
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind 127.0.0.1");
    if (listen(fd, 1024) < 0) die("listen");
    return fd;
}

int main(int argc, char **argv) {
    int port = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--echo") == 0) echo_all = 1;
        else port = atoi(argv[i]);
    }
    if (port <= 0 || port > 65535) {
        fprintf(stderr, "usage: ltb-relay [--echo] PORT   (listens on 127.0.0.1:PORT)\n");
        return 64;
    }
    /* SIGTERM/SIGINT are blocked except inside epoll_pwait, so a stop request
     * always ends the wait and is never lost between the check and the wait. */
    sigset_t stop, none;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    sigemptyset(&none);
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    clients = calloc(MAX_CLIENTS, sizeof *clients);
    if (!clients) die("calloc");
    int lfd = listen_on(port);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = NULL };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev) < 0) die("epoll_ctl listener");
    fprintf(stderr, "ltb-relay: listening on 127.0.0.1:%d%s\n", port, echo_all ? " (echo)" : "");

    static struct epoll_event events[MAX_EVENTS];
    while (!stopping) {
        int n = epoll_pwait(ep, events, MAX_EVENTS, -1, &none);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_pwait");
        }
        pass++;
        stats.passes++;
        batch.len = 0;
        for (int i = 0; i < n; i++) {
            struct client *c = events[i].data.ptr;
            if (!c) { accept_some(lfd); continue; }
            if (c->closing) continue;
            if (events[i].events & EPOLLOUT) write_backlog(c);
            if (c->closing || batch.len >= BATCH_SOFT_LIMIT) continue;
            if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_client(c);
        }
        if (batch.len > 0)
            for (size_t i = 0; i < nclients; i++)
                if (!clients[i]->closing) deliver(clients[i]);
        reap();
    }
    fprintf(stderr,
            "ltb-relay: stopped: %llu passes, %llu frames relayed, %llu heartbeats, %llu writes, "
            "%llu bytes written, %llu bytes backlogged (%.4f copies per byte written), %llu slow consumers closed\n",
            (unsigned long long)stats.passes, (unsigned long long)stats.frames,
            (unsigned long long)stats.heartbeats, (unsigned long long)stats.writes,
            (unsigned long long)stats.bytes_written, (unsigned long long)stats.bytes_backlogged,
            stats.bytes_written ? (double)stats.bytes_backlogged / (double)stats.bytes_written : 0.0,
            (unsigned long long)stats.closed_slow);
    return 0;
}
