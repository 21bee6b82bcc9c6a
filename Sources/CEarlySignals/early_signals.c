// See early_signals.h. A SIGHUP used to kill a starting roomcastd: its
// default action terminates the process, and main.swift blocks it only after
// the Swift runtime's start-up (about 11 ms after exec). Here it is blocked
// from the executable's .preinit_array, which the dynamic loader runs after
// relocation and before any shared library's initializer (libswiftCore,
// Foundation, ...), and again from a constructor in case a toolchain drops
// .preinit_array. What is left is the loader's own work before that point.
#include "early_signals.h"

#include <signal.h>

static unsigned long long blocked;

static void roomcastd_block_early(void) {
    if (blocked != 0) return;
    static const int signals[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR2 };
    sigset_t set;
    sigemptyset(&set);
    unsigned long long mask = 0;
    for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        sigaddset(&set, signals[i]);
        mask |= 1ULL << (signals[i] - 1);
    }
    // One thread exists at this point, so the process mask is this thread's.
    if (sigprocmask(SIG_BLOCK, &set, 0) == 0) blocked = mask;
}

__attribute__((section(".preinit_array"), used))
static void (*const roomcastd_preinit)(void) = roomcastd_block_early;

__attribute__((constructor(101)))
static void roomcastd_constructor(void) { roomcastd_block_early(); }

unsigned long long roomcastd_early_blocked_signals(void) { return blocked; }
