// hiredis (Debian's libhiredis-dev, 0.14.1 on Debian 12): only its RESP
// reply parser, `redisReader` (redisReaderCreate/Feed/GetReply), which
// reports a protocol error as a value. The sockets, the commands and the
// matching of replies to commands are roomcastd's own
// (Sources/RoomcastServer/Cluster/RedisConnection.swift): hiredis's async
// layer asserts, and so aborts the process, on a reply it did not expect.
#ifndef ROOMCAST_CHIREDIS_SHIM_H
#define ROOMCAST_CHIREDIS_SHIM_H

#include <hiredis/hiredis.h>
#include <sys/random.h>   /* getrandom(2): the cluster origin id (Glibc's overlay lacks it) */

/// Bytes fed to the reader and not yet part of a whole reply it returned.
static inline size_t roomcast_reader_buffered(const redisReader *r) {
    return r->len - r->pos;
}

/// Whether the reader is inside a reply (an array begun, not finished).
static inline int roomcast_reader_in_reply(const redisReader *r) {
    return r->ridx >= 0;
}

#endif
