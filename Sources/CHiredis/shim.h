// hiredis (Debian's libhiredis-dev, 0.14.1 on Debian 12): the async API,
// driven by roomcastd's own epoll loop through its adapter hooks
// (Sources/RoomcastServer/RedisConnection.swift). redisAsyncCommand is
// variadic and does not import: every command goes through
// redisAsyncCommandArgv.
#ifndef ROOMCAST_CHIREDIS_SHIM_H
#define ROOMCAST_CHIREDIS_SHIM_H

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <sys/random.h>   /* getrandom(2): the cluster origin id (Glibc's overlay lacks it) */

/// Bytes hiredis holds for the server and has not written yet (its output
/// buffer is unbounded: the caller caps it).
static inline size_t roomcast_redis_pending_output(const redisAsyncContext *ac) {
    return sdslen(ac->c.obuf);
}

/// Whether the non-blocking connect has completed (hiredis sets the flag at
/// the first write event).
static inline int roomcast_redis_connected(const redisAsyncContext *ac) {
    return (ac->c.flags & REDIS_CONNECTED) != 0;
}

#endif
