"""The systemd suite: restarts, an upgrade and a crash that keep every client; positions; the fd budget.

Part of systemd/test-systemd.py (its docstring says what the suite changes and why)."""
import os
import shutil
import socket
import struct
import threading
import time
from chatpool import ChatPool, field, fields, pid_cpu_seconds, user_info
from sdharness import (
    BINDIR,
    Client,
    HANDOVER_CLIENTS,
    HANDOVER_RATE,
    HANDOVER_ROOMS,
    JOIN,
    NOTICE,
    OPAQUE,
    PID1,
    State,
    TEXT,
    UNIT,
    cursor,
    eventually,
    find,
    journal,
    messages,
    run,
    show,
    write_file,
)
from sd_service import status_text, write_config

def during(pool, argv, before=1.0, after=3.0):
    """Runs argv in the container while the pool keeps chatting; returns
    (CompletedProcess, t0, t1) with t0/t1 the command's start and end (monotonic s)."""
    pool.run(before)
    out = {}

    def go():
        out["t0"] = time.monotonic()
        out["p"] = run(*argv, check=False, timeout=60)
        out["t1"] = time.monotonic()
    worker = threading.Thread(target=go)
    worker.start()
    while worker.is_alive():
        pool.run(0.02)
    worker.join()
    pool.run(after)
    return out["p"], out["t0"], out["t1"]


class HandOverFigures:
    rows = []


def event(t, pool, label, argv, journal_lines=False):
    """One restart-like event with the pool chatting; checks the process changed
    and the journal reports the restore; records the gap and PID 1's CPU."""
    before = show(UNIT, "MainPID")["MainPID"]
    mark = cursor()
    cpu0 = pid_cpu_seconds(PID1)
    p, t0, t1 = during(pool, argv)
    cpu1 = pid_cpu_seconds(PID1)
    after = show(UNIT, "MainPID", "ActiveState")
    t.check(f"{label}: {' '.join(argv)} succeeds", p.returncode == 0, p.stderr.strip())
    t.check(f"{label}: a new process serves (PID {before} -> {after['MainPID']})",
            after["MainPID"] not in (before, "0") and after["ActiveState"] == "active", str(after))
    recs = eventually(lambda: find(journal(after=mark), "restored "), timeout=5)
    restored = recs[0]["MESSAGE"] if recs else ""
    t.check(f"{label}: the journal says what was restored", bool(recs), str(messages(journal(after=mark))))
    p50, p99, worst, n = pool.window(t0 - 0.5, t1 + 1.0)
    eof, rst = pool.closed()
    HandOverFigures.rows.append((label, t1 - t0, p99, worst, n, cpu1 - cpu0, restored))
    print(f"        {label}: systemctl took {(t1 - t0) * 1000:.0f} ms; frames sent around it: {n}, "
          f"relay latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms; PID 1 CPU {1000 * (cpu1 - cpu0):.0f} ms; "
          f"closed so far: {eof} EOF, {rst} RST")
    print(f"        | {restored}")
    if journal_lines:
        print(f"        journal of the {label} (journalctl -u {UNIT}):")
        recs = journal(after=mark)
        first = int(recs[0]["__MONOTONIC_TIMESTAMP"]) if recs else 0
        for r in recs:
            ms = (int(r["__MONOTONIC_TIMESTAMP"]) - first) / 1000
            print(f"        | +{ms:6.1f} ms  {r.get('SYSLOG_IDENTIFIER', '?')}: {r.get('MESSAGE', '')}")
    return restored


def test_handover(t, stage):
    """1,000 joined clients in 10 rooms chatting across two restarts, an
    upgrade and a SIGKILL: no EOF, no RST; across restarts and the upgrade no frame
    lost, duplicated or reordered, partial frames and output owed to a slow reader
    carried over; after the SIGKILL every client back in its room, losses counted."""
    write_config(stage, "[limits]\noutput_soft_bytes = 4M\noutput_hard_bytes = 8M\n")
    s = show(UNIT, "FileDescriptorStoreMax", "ExecStop")
    t.check("the unit has an fd store (FileDescriptorStoreMax=16) and no stop hook",
            s["FileDescriptorStoreMax"] == "16" and "roomcastd" not in s.get("ExecStop", ""), str(s))
    pool = ChatPool(State.port, clients=HANDOVER_CLIENTS, rooms=HANDOVER_ROOMS, rate=HANDOVER_RATE)
    try:
        pool.connect()
        pool.join()
        t.check(f"{HANDOVER_CLIENTS} clients joined {HANDOVER_ROOMS} rooms",
                eventually(lambda: status_text().startswith(f"{HANDOVER_CLIENTS} clients, {HANDOVER_ROOMS} rooms"), timeout=6),
                status_text())
        pool.start_chat()
        pool.run(3)
        _, base99, basemax, basen = pool.window(0, time.monotonic())
        print(f"        before any restart: {basen} deliveries, relay latency p99 {base99:.1f} ms, max {basemax:.1f} ms")

        # 1. A restart, with ten clients in the middle of a frame.
        pool.split_next(pool.members[::100])
        restored = event(t, pool, "restart 1", ["systemctl", "restart", UNIT], journal_lines=True)
        t.check(f"restart 1: restored {HANDOVER_CLIENTS} connections in {HANDOVER_ROOMS} rooms",
                f"restored {HANDOVER_CLIENTS} connections in {HANDOVER_ROOMS} rooms in " in restored, restored)
        pool.complete_split()

        # 2. A restart while the daemon owes a slow reader more than the kernel holds.
        reader = Client(State.port, rcvbuf=4096)
        bulk = Client(State.port)
        reader.send(JOIN, user_info("slow", "bulk"))
        bulk.send(JOIN, user_info("bulk", "bulk"))
        bulk.recv()  # its own join echoed: both are in the room
        payloads = [struct.pack("<I", i) + bytes([i]) * (16 * 1024 - 4) for i in range(30)]
        for body in payloads:
            bulk.send(OPAQUE, body)
            bulk.recv()  # its echo: the daemon has queued the frame for the reader too
        pool.split_next(pool.members[50::100])
        event(t, pool, "restart 2", ["systemctl", "restart", UNIT])
        pool.complete_split()
        got = []
        try:
            while len(got) < 2 + len(payloads):
                got.append(reader.recv(timeout=10))
        except (EOFError, socket.timeout) as e:
            print(f"        reader: {type(e).__name__} after {len(got)} frames")
        t.check(f"restart 2: {len(payloads)} frames x 16 KiB owed to a slow reader arrive once, whole and in order",
                [g for g in got if g[0] == OPAQUE] == [(OPAQUE, b) for b in payloads], f"got {len(got)} frames")
        bulk.close()  # its leave goes to the reader with the identity carried over twice
        leave = reader.recv(timeout=5)
        t.check("restart 2: the identity carried over: the room hears the join's UserInfo when a client leaves",
                leave == (1, user_info("bulk", "bulk")), repr(leave[:1]))
        reader.close()

        # 3. Two restarts in a row: the second comes while the process the
        # first started is still starting (restoring, before READY=1), where
        # systemd sends SIGTERM without running ExecStop=; it hands over as
        # any SIGTERM does. (A second restart while the first one's stop
        # still runs is merged into it by PID 1: one restart.)
        mark = cursor()
        event(t, pool, "restart x2", ["sh", "-c", f"systemctl restart --no-block {UNIT}; "
                                      f"for i in $(seq 400); do [ $(systemctl show -P ActiveState {UNIT}) = activating ] && break; sleep 0.005; done; "
                                      f"sleep 0.05; systemctl restart {UNIT}"])
        msgs = messages(journal(after=mark))
        starting = [m for m in msgs if m.startswith("Starting roomcastd.service")]
        handed = [m for m in msgs if "to systemd's fd store in" in m]
        # The second SIGTERM finds the process restoring (it hands over again)
        # or, earlier, before its first instruction (it dies with nothing taken
        # and the next process restores the same store): either way no client
        # is lost, which the checks after the upgrade count.
        t.check("restart x2: systemd started two processes, the second SIGTERM reached one that was starting",
                len(starting) == 2, str(starting))
        for m in [m for m in msgs if m.startswith("restored ") or "to systemd's fd store in" in m or "received SIGTERM" in m]:
            print(f"        | {m}")

        # 4. An upgrade: a new binary file is installed, then restart.
        binary = os.path.join(stage, BINDIR, "roomcastd")
        old_inode = os.stat(binary).st_ino
        shutil.copy2(binary, binary + ".new")
        os.replace(binary + ".new", binary)
        t.check("upgrade: the binary is a new file (as dpkg and make install leave it)", os.stat(binary).st_ino != old_inode)
        pool.split_next(pool.members[25::100])
        event(t, pool, "upgrade", ["systemctl", "restart", UNIT])
        pool.complete_split()
        exe = run("stat", "-L", "-c", "%i", f"/proc/{show(UNIT, 'MainPID')['MainPID']}/exe", check=False).stdout.strip()
        t.check("upgrade: the new process runs the new file", exe == str(os.stat(binary).st_ino), f"{exe} vs {os.stat(binary).st_ino}")

        pool.run(2)
        pool.drain()
        eof, rst = pool.closed()
        expected = pool.expected()
        received = pool.deliveries()
        t.check("no client saw EOF or RST across four restarts (two 50 ms apart) and an upgrade", eof == 0 and rst == 0, f"{eof} EOF, {rst} RST")
        t.check(f"every chat frame arrived once and in order ({received} of {expected} deliveries)",
                pool.lost() == 0 and pool.duplicates == 0 and pool.skipped == 0 and pool.foreign == 0 and received == expected,
                f"lost {pool.lost()}, duplicated or reordered {pool.duplicates}, skipped {pool.skipped}, from another room {pool.foreign}")
        print(f"        {sum(pool.sent)} chat frames sent, {received} deliveries checked for order, loss and duplicates")

        # 5. A crash: SIGKILL, nothing handed over; the live box and log bring everyone back.
        expected0, received0 = pool.expected(), pool.deliveries()
        pool.start_chat()
        pool.split_next(pool.members[75::100])
        restored = event(t, pool, "SIGKILL", ["systemctl", "kill", "-s", "SIGKILL", UNIT])
        t.check(f"SIGKILL: restored {HANDOVER_CLIENTS} connections in {HANDOVER_ROOMS} rooms after a crash",
                f"restored {HANDOVER_CLIENTS} connections in {HANDOVER_ROOMS} rooms in " in restored and "after a crash" in restored, restored)
        pool.complete_split()
        pool.run(2)
        pool.drain()
        eof, rst = pool.closed()
        t.check("SIGKILL: no client saw EOF or RST", eof == 0 and rst == 0, f"{eof} EOF, {rst} RST")
        t.check("SIGKILL: nothing duplicated or reordered, nothing from another room (every client in its room)",
                pool.duplicates == 0 and pool.foreign == 0, f"duplicated or reordered {pool.duplicates}, from another room {pool.foreign}")
        lost = pool.lost()
        crash_expected = pool.expected() - expected0
        print(f"        SIGKILL: {crash_expected} deliveries expected, {pool.deliveries() - received0} received, {lost} lost "
              f"({pool.skipped} seen as gaps): frames the killed process had read but not yet written to every member "
              f"(its output queues and this iteration's batch live only in memory); the split frames completed (partial input is in the live log)")
        t.check("SIGKILL: what was lost is accounted for (expected = received + lost)",
                crash_expected == pool.deliveries() - received0 + lost)
    finally:
        pool.close()
    print("        summary: event, systemctl time, p99 / max relay latency of frames sent around it, PID 1 CPU")
    for label, took, p99, worst, n, cpu, _ in HandOverFigures.rows:
        print(f"        | {label:10} {took * 1000:6.0f} ms   p99 {p99:7.1f} ms   max {worst:7.1f} ms   ({n} frames)   PID 1 CPU {cpu * 1000:4.0f} ms")
    write_config(stage, "")


def test_positions_restart(t, stage):
    """docs/protocol/positions.md §4: positions survive systemctl restart (the hand-over state): the room keeps its
    epoch, its numbers and its recent lines, and a rejoin "since" is served exactly."""
    write_config(stage, "[rooms]\nhistory = 50\n")
    run("systemctl", "restart", UNIT)
    s = Client(State.port)
    s.send(JOIN, user_info("streamer", "positions"))
    s.recv(), s.recv()  # its join echo, the notice history (0)
    v = Client(State.port)
    v.send(JOIN, user_info("viewer", "positions") + field(6, 1))
    notices = []

    def texts(n, sent_by):
        for i in range(n):
            s.send(TEXT, field(1, user_info("streamer", "positions")) + field(2, f"{sent_by} {i}"))
            s.recv()  # its echo: relayed
    texts(10, "before")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (notices and notices[-1].get(6) == 10):
        type_, body = v.recv()
        if type_ == NOTICE:
            notices.append(fields(body))
    epoch = notices[-1].get(5) if notices else None
    t.check("a viewer asking for positions gets the notice position with seq 10 after 10 lines",
            bool(notices) and notices[-1].get(1) == b"position" and epoch and len(epoch) == 16, repr(notices[-1:]))
    run("systemctl", "restart", UNIT)  # a hand-over: both clients stay connected
    texts(5, "after")
    late = Client(State.port)
    late.send(JOIN, user_info("late", "positions") + field(7, epoch or b"") + field(8, 8))
    late.recv()  # its join echo
    n = fields(late.recv()[1])
    t.check("after the restart a rejoin since seq 8 gets the notice history (count 7) under the same epoch, seq 15",
            n.get(1) == b"history" and n.get(4) == 7 and n.get(5) == epoch and n.get(6) == 15, repr(n))
    got = [fields(late.recv()[1]).get(2) for _ in range(7)]
    t.check("and exactly lines 9-15: the two the restart carried in the history, then the five after it",
            got == [b"before 8", b"before 9"] + [f"after {i}".encode() for i in range(5)], repr(got))
    for c in (s, v, late):
        c.close()
    write_config(stage, "")


def test_budget(t):
    """LimitNOFILE= lowered so that the live box cannot hold max_clients
    (descriptors in flight count against RLIMIT_NOFILE): told at start in
    one line with the numbers; a rebuild that no longer fits is logged once
    and retried with backoff, never an error per loop turn; a restart keeps
    every client."""
    dropin = "/etc/systemd/system/roomcastd.service.d/nofile.conf"
    write_file(dropin, "[Service]\nLimitNOFILE=3000\n")
    run("systemctl", "daemon-reload")
    mark = cursor()
    run("systemctl", "restart", UNIT)
    clients = []
    try:
        budget = eventually(lambda: [r for r in journal(after=mark) if r.get("REASON") == "handover_budget"], timeout=5)
        line = budget[0]["MESSAGE"] if budget else ""
        t.check("told at start, in one line (REASON=handover_budget), with the numbers",
                len(budget) == 1 and "30000 descriptors in flight" in line and "RLIMIT_NOFILE is 3000" in line, line or "no such record")
        print(f"        | {line}")
        # 1,600 clients: the live box holds 1,600; once 100 close, a rebuild
        # would need the old box and a new one (3,100) in flight: over 3,000.
        for _ in range(1600):
            clients.append(Client(State.port))
        t.check("1,600 clients connected", eventually(lambda: status_text().startswith("1600 clients"), timeout=10), status_text())
        mark = cursor()
        for c in clients[:100]:
            c.close()
        del clients[:100]
        # More loop turns that accept and close clients, for 3 s.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            extra = Client(State.port)
            time.sleep(0.02)
            extra.close()
        recs = journal(after=mark)
        failed = [r["MESSAGE"] for r in recs if r.get("REASON") == "handover_failed"]
        t.check("the rebuild that does not fit: logged once in 3 s of accepting, not per loop turn", len(failed) == 1, str(failed))
        for m in failed[:3]:
            print(f"        | {m}")
        mark = cursor()
        run("systemctl", "restart", UNIT)
        recs = eventually(lambda: find(journal(after=mark), "restored "), timeout=5)
        restored = recs[0]["MESSAGE"] if recs else ""
        t.check("a restart under the broken budget keeps every client (the live box holds them all)",
                restored.startswith(f"restored {len(clients)} connections"), restored)
        time.sleep(0.5)
        import select
        poller = select.poll()
        for c in clients:
            poller.register(c.sock, select.POLLIN)
        readable = poller.poll(0)
        t.check("no client was closed", not readable, f"{len(readable)} readable (EOF or reset)")
    finally:
        for c in clients:
            c.close()
        run("rm", "-f", dropin)
        run("systemctl", "daemon-reload")
        run("systemctl", "restart", UNIT)
