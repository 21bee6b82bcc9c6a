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

/// What one reply may hold, nested elements included (issue 28: a reply
/// is input). hiredis 0.14.1 has no `maxelements` (1.0 added it) and
/// bounds only the unparsed buffer, while every element it has parsed is
/// an object already: an array of ten million small strings grows memory
/// while `roomcast_reader_buffered` stays small. So the reader builds its
/// replies through these functions, which count each object's bytes
/// against `max` and refuse (NULL: the reader reports an error and frees
/// the partial reply) once one reply would hold more; `exceeded` then
/// says why. One budget per reader (its `privdata`), reset at each reply's
/// root element.
typedef struct roomcast_reply_budget {
    size_t max;
    size_t used;
    int exceeded;
    redisReplyObjectFunctions *inner;  /* hiredis's own functions */
    redisReplyObjectFunctions fn;      /* these, pointing at the ones below */
} roomcast_reply_budget;

/// Bytes an object costs: its own size and, for an array, a pointer per element.
static inline int roomcast_budget_take(const redisReadTask *task, size_t cost) {
    roomcast_reply_budget *b = (roomcast_reply_budget *)task->privdata;
    if (task->parent == NULL) b->used = 0;  /* the root of the next reply */
    if (cost > b->max || b->used > b->max - cost) { b->exceeded = 1; return 0; }
    b->used += cost;
    return 1;
}

static inline void *roomcast_budget_string(const redisReadTask *task, char *s, size_t len) {
    roomcast_reply_budget *b = (roomcast_reply_budget *)task->privdata;
    if (!roomcast_budget_take(task, sizeof(redisReply) + len + 1)) return NULL;
    return b->inner->createString(task, s, len);
}

static inline void *roomcast_budget_array(const redisReadTask *task, int elements) {
    roomcast_reply_budget *b = (roomcast_reply_budget *)task->privdata;
    if (elements < 0 || !roomcast_budget_take(task, sizeof(redisReply) + (size_t)elements * sizeof(redisReply *))) return NULL;
    return b->inner->createArray(task, elements);
}

static inline void *roomcast_budget_integer(const redisReadTask *task, long long value) {
    roomcast_reply_budget *b = (roomcast_reply_budget *)task->privdata;
    if (!roomcast_budget_take(task, sizeof(redisReply))) return NULL;
    return b->inner->createInteger(task, value);
}

static inline void *roomcast_budget_nil(const redisReadTask *task) {
    roomcast_reply_budget *b = (roomcast_reply_budget *)task->privdata;
    if (!roomcast_budget_take(task, sizeof(redisReply))) return NULL;
    return b->inner->createNil(task);
}

/// A reader whose replies are bounded by `budget` (zeroed but for `max`;
/// it must outlive the reader). NULL if hiredis cannot allocate one.
static inline redisReader *roomcast_reader_create(roomcast_reply_budget *budget) {
    redisReader *r = redisReaderCreate();
    if (r == NULL) return NULL;
    budget->used = 0;
    budget->exceeded = 0;
    budget->inner = r->fn;
    budget->fn.createString = roomcast_budget_string;
    budget->fn.createArray = roomcast_budget_array;
    budget->fn.createInteger = roomcast_budget_integer;
    budget->fn.createNil = roomcast_budget_nil;
    budget->fn.freeObject = r->fn->freeObject;
    r->fn = &budget->fn;
    r->privdata = budget;
    return r;
}

#endif
