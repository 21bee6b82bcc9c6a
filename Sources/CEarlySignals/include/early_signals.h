// roomcastd only: blocks the signals the daemon takes through its signalfd
// (SIGTERM, SIGINT, SIGHUP, and SIGUSR2, which it ignores) from an ELF initializer, before the Swift runtime
// starts and long before main.swift runs. Linked into the roomcastd
// executable alone: the client, the bench, the soak driver and the test
// bundle must keep their signals (see Package.swift).
#ifndef ROOMCASTD_EARLY_SIGNALS_H
#define ROOMCASTD_EARLY_SIGNALS_H

/// The signals the initializer blocked, as a bit mask (bit `sig - 1` for
/// signal `sig`); 0 if it did not run or sigprocmask(2) failed. main.swift
/// calls it, which also keeps this object (and so the initializer) linked.
unsigned long long roomcastd_early_blocked_signals(void);

#endif
