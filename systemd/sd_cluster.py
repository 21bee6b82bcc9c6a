"""The systemd suite: two daemons on one Redis across restarts and a crash.

Part of systemd/test-systemd.py (its docstring says what the suite changes and why)."""
import os
import shutil
import socket
import subprocess
import time
from chatpool import ChatPool
from sdharness import (
    CLUSTER_CLIENTS,
    CLUSTER_NAME,
    CLUSTER_RATE,
    CLUSTER_RESTARTS_50MS_APART,
    CLUSTER_RESTART_GRACE,
    CLUSTER_ROOMS,
    CLUSTER_SOCKET_DIR,
    State,
    UNIT,
    cursor,
    eventually,
    find,
    free_port,
    journal,
    messages,
    run,
    show,
)
from sd_service import status_text, write_config
from sd_handover import during

def redis_numsub(port, rooms):
    """{room: subscribers} from `redis-cli PUBSUB NUMSUB` of the rooms' channels."""
    channels = [f"roomcast:{CLUSTER_NAME}:room:{r}" for r in rooms]
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "PUBSUB", "NUMSUB", *channels],
                         capture_output=True, text=True, timeout=5).stdout.split()
    got = dict(zip(out[0::2], out[1::2]))
    return {r: int(got.get(c, -1)) for r, c in zip(rooms, channels)}


def wait_port(port, proc, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited {proc.returncode} before listening on 127.0.0.1:{port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def stop_process(proc, sig_timeout=5):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=sig_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cluster_stop(t, pool, half):
    """`systemctl stop` of the systemd daemon, after the restarts and the
    crash: every SIGTERM hands over, so the daemon cannot tell this stop
    from a restart; it announces the hand-over with its restart_grace, and
    the host daemon's members get a leave for each of its users once that
    has passed (long before cluster.timeout, 2 s, counted from its last
    heartbeat). Every user is still tracked after the restarts: no ghost.
    The host daemon knows the users whose join it relayed: one that joined
    before the host daemon subscribed to its room (the pool joins everyone
    at once) reached no host member and gets no leave there either."""
    leaves0 = len(pool.leaves)
    # Each host member gets the leave of every systemd member of its room whose join the host daemon relayed.
    seen = {body for r, body in pool.joins if pool.daemon(r) == 1}
    on_systemd = [m for m in pool.members if pool.daemon(m.i) == 0]
    unseen = [o for o in on_systemd if o.identity not in seen]
    if unseen:
        print(f"        {len(unseen)} of the systemd daemon's {len(on_systemd)} users joined before the host daemon subscribed to "
              f"their room: no host member saw them join, and none gets their leave")
    expected = sum(1 for m in pool.members if pool.daemon(m.i) == 1 and not m.closed
                   for o in on_systemd if o.room == m.room and o.identity in seen)
    t0 = time.monotonic()
    p = run("systemctl", "stop", UNIT, check=False, timeout=60)
    t1 = time.monotonic()
    deadline = t1 + CLUSTER_RESTART_GRACE + 5
    while time.monotonic() < deadline and len(pool.leaves) - leaves0 < expected:
        pool._poll(0.05)
    got = pool.leaves[leaves0:]
    to_host = [x for x in got if pool.daemon(x[0]) == 1]
    last = max((x[1] for x in to_host), default=None)
    first = min((x[1] for x in to_host), default=None)
    t.check("systemctl stop (with 2 restarts and a crash before it) succeeds", p.returncode == 0, p.stderr.strip())
    print(f"        systemctl stop took {(t1 - t0) * 1000:.0f} ms; the host daemon's members got {len(to_host)} of {expected} leaves, "
          + (f"the first {(first - t1) * 1000:.0f} ms and the last {(last - t1) * 1000:.0f} ms after it returned "
             f"(restart_grace {CLUSTER_RESTART_GRACE * 1000:.0f} ms)" if last else "none"))
    t.check(f"systemctl stop: the host daemon's {half} members got a leave for each user of the systemd daemon in their room "
            "whose join the host daemon relayed, once",
            len(to_host) == expected and len(set((x[0], x[2]) for x in to_host)) == expected, f"{len(to_host)} of {expected}")
    # The host daemon sends them all in one loop turn; this pool reads 20,000-odd frames in a few hundred ms more.
    t.check(f"systemctl stop: the leaves began within restart_grace ({CLUSTER_RESTART_GRACE * 1000:.0f} ms) and 500 ms of slack "
            f"after systemctl returned (not after cluster.timeout of silence) and were all read within 2 s more",
            last is not None and CLUSTER_RESTART_GRACE * 0.5 <= first - t1 <= CLUSTER_RESTART_GRACE + 0.5
            and last - t1 <= CLUSTER_RESTART_GRACE + 2.0,
            f"first {(first - t1) * 1000:.0f} ms, last {(last - t1) * 1000:.0f} ms" if last else "no leave")


def test_cluster_handover(t, stage, install_stage):
    """Two daemons on one Redis: the packaged one under systemd (Redis through
    its Unix socket) and the release binary on the host (over TCP), 1,000
    clients split across both, every room with members on each. Two restarts
    and a SIGKILL of the systemd one: no EOF or RST, every frame sent after
    its READY=1 reaches every member on both daemons, and after each event
    Redis counts two subscribers on every room's channel (PUBSUB NUMSUB)."""
    rport, hport = free_port(), free_port()
    sockdir = os.path.join(stage, CLUSTER_SOCKET_DIR.lstrip("/"))
    os.makedirs(sockdir, exist_ok=True)
    os.chmod(sockdir, 0o755)
    work = subprocess.run(["mktemp", "-d", "/tmp/roomcast-cluster.XXXXXX"], capture_output=True, text=True).stdout.strip()
    redis = host = pool = None
    limits = "[limits]\noutput_soft_bytes = 4M\noutput_hard_bytes = 8M\n"
    rooms = [f"room{r}" for r in range(CLUSTER_ROOMS)]
    rows = []
    try:
        redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                                  "--unixsocket", os.path.join(sockdir, "redis.sock"), "--unixsocketperm", "777",
                                  "--save", "", "--appendonly", "no", "--protected-mode", "no",
                                  "--client-output-buffer-limit", "pubsub", "64mb", "16mb", "30"],
                                 stdout=open(os.path.join(work, "redis.log"), "w"), stderr=subprocess.STDOUT)
        wait_port(rport, redis)
        write_config(stage, limits + f"\n[cluster]\nredis = unix:{CLUSTER_SOCKET_DIR}/redis.sock\nname = {CLUSTER_NAME}\n")
        run("systemctl", "restart", UNIT)
        connected = eventually(lambda: "cluster connected" in status_text(), timeout=6)
        t.check(f"the systemd daemon reaches Redis through unix:{CLUSTER_SOCKET_DIR}/redis.sock", connected, status_text())
        conf = os.path.join(work, "roomcastd.conf")
        with open(conf, "w") as f:
            f.write(f"[server]\nlisten = 127.0.0.1:{hport}\n\n" + limits
                    + f"\n[cluster]\nredis = 127.0.0.1:{rport}\nname = {CLUSTER_NAME}\n")
        binary = os.path.join(install_stage, "usr/local/bin/roomcastd")
        host = subprocess.Popen([binary, "--config", conf], stdout=open(os.path.join(work, "host.log"), "w"),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_port(hport, host)

        pool = ChatPool([State.port, hport], clients=CLUSTER_CLIENTS, rooms=CLUSTER_ROOMS, rate=CLUSTER_RATE)
        pool.connect()
        pool.join()
        half = CLUSTER_CLIENTS // 2
        t.check(f"{CLUSTER_CLIENTS} clients joined {CLUSTER_ROOMS} rooms, {half} on each daemon",
                eventually(lambda: status_text().startswith(f"{half} clients, {CLUSTER_ROOMS} rooms"), timeout=6),
                status_text())
        subs = eventually(lambda: (lambda n: n if set(n.values()) == {2} else None)(redis_numsub(rport, rooms)), timeout=5)
        t.check(f"before the events: PUBSUB NUMSUB shows 2 subscribers on each of the {CLUSTER_ROOMS} rooms' channels",
                bool(subs), str(redis_numsub(rport, rooms)))
        pool.start_chat()
        pool.run(3)
        pool.drain()
        t.check("before the events: every frame reached every member on both daemons",
                pool.lost() == 0 and pool.duplicates == 0 and pool.foreign == 0,
                f"lost {pool.lost_between()}, duplicated or reordered {pool.duplicates}, from another room {pool.foreign}")
        _, base99, basemax, basen = pool.window(0, time.monotonic())
        rows.append(("before", 0.0, base99, basemax, basen, 0, 0, {}, 0, 0, redis_numsub(rport, rooms)))

        gap = 0.05 if CLUSTER_RESTARTS_50MS_APART else 2.0
        double = ["sh", "-c", f"systemctl restart --no-block {UNIT}; "
                  f"for i in $(seq 400); do [ $(systemctl show -P ActiveState {UNIT}) = activating ] && break; sleep 0.005; done; "
                  f"sleep {gap}; systemctl restart {UNIT}"]
        events = [(f"2 restarts {gap * 1000:.0f} ms apart", double),
                  ("SIGKILL", ["systemctl", "kill", "-s", "SIGKILL", UNIT])]
        for label, argv in events:
            leaves0 = len(pool.leaves)
            lost0, dup0, foreign0 = pool.lost_between(), pool.duplicates, pool.foreign
            sent0 = len(pool.sent_at)
            pid = show(UNIT, "MainPID")["MainPID"]
            mark = cursor()
            pool.start_chat()
            p, t0, t1 = during(pool, argv)
            pool.drain()
            after = show(UNIT, "MainPID", "ActiveState")
            t.check(f"{label}: systemctl succeeds", p.returncode == 0, p.stderr.strip())
            t.check(f"{label}: a new process serves (PID {pid} -> {after['MainPID']})",
                    after["MainPID"] not in (pid, "0") and after["ActiveState"] == "active", str(after))
            ready = [int(r["__MONOTONIC_TIMESTAMP"]) / 1e6 for r in find(journal(after=mark), "roomcastd ready")]
            t.check(f"{label}: the journal has the new process's 'roomcastd ready' (after READY=1)", bool(ready))
            t_ready = max(ready) if ready else t1
            recs = journal(after=mark)
            for m in messages(recs):
                if m.startswith("restored ") or "to systemd's fd store in" in m or "received SIGTERM" in m:
                    print(f"        | {m}")
            if argv is double:
                starting = [m for m in messages(recs) if m.startswith("Starting roomcastd.service")]
                t.check(f"{label}: systemd started two processes (the second restart was not merged into the first)",
                        len(starting) == 2, str(starting))
            gaps = [r for r in recs if r.get("REASON") == "cluster_gap"]
            if gaps:
                print(f"        | the systemd daemon counted {sum(int(r.get('LENGTH', 0)) for r in gaps)} frames of the host daemon "
                      f"as never arrived (REASON=cluster_gap, {len(gaps)} records), e.g. {gaps[0]['MESSAGE']}")
            eof, rst = pool.closed()
            lost = {k: v - lost0.get(k, 0) for k, v in pool.lost_between().items()}
            late = [m for m in pool.missing() if m[0] >= t_ready]
            _, p99, worst, n = pool.window(t0 - 0.5, t1 + 1.0)
            subs = eventually(lambda: (lambda n: n if set(n.values()) == {2} else None)(redis_numsub(rport, rooms)), timeout=3)
            subs = subs or redis_numsub(rport, rooms)
            rows.append((label, t1 - t0, p99, worst, n, eof, rst, lost, pool.duplicates - dup0,
                         sum(m[3] for m in late), subs))
            print(f"        {label}: systemctl took {(t1 - t0) * 1000:.0f} ms, READY=1 {(t_ready - t0) * 1000:.0f} ms after it began; "
                  f"{len(pool.sent_at) - sent0} frames sent, relay latency around it p99 {p99:.1f} ms, max {worst:.1f} ms; "
                  f"lost (sender's daemon -> receiver's, 0 = systemd, 1 = host) {lost}")
            t.check(f"{label}: no client on either daemon saw EOF or RST", eof == 0 and rst == 0, f"{eof} EOF, {rst} RST")
            t.check(f"{label}: nothing duplicated or reordered, nothing from another room",
                    pool.duplicates == dup0 and pool.foreign == foreign0,
                    f"duplicated or reordered {pool.duplicates - dup0}, from another room {pool.foreign - foreign0}")
            t.check(f"{label}: every frame sent after READY=1 reached every member on both daemons",
                    late == [], f"{len(late)} frames missed by {sum(m[3] for m in late)} members, the first sent "
                    f"{(late[0][0] - t_ready) * 1000:.0f} ms after READY=1" if late else "")
            t.check(f"{label}: PUBSUB NUMSUB shows 2 subscribers on each room's channel",
                    set(subs.values()) == {2}, str(subs))
            t.check(f"{label}: no member on either daemon got a leave (the host daemon waited for the systemd one: no ghost, "
                    "no departure)", len(pool.leaves) == leaves0, f"{len(pool.leaves) - leaves0} leaves")
            late_return = [m for m in messages(recs) if "restart_grace the hand-over announced" in m]
            t.check(f"{label}: the restarted daemon was back within restart_grace (no members announced again)",
                    not late_return, "; ".join(late_return))
        cluster_stop(t, pool, half)
        total = pool.lost()
        print(f"        {sum(pool.sent)} chat frames sent, {pool.deliveries()} of {pool.expected()} deliveries, {total} lost")
    finally:
        if pool:
            pool.close()
        stop_process(host)
        stop_process(redis)
        for name in ("host.log", "redis.log"):
            path = os.path.join(work, name)
            if os.path.exists(path):
                lines = [l.rstrip() for l in open(path, errors="replace") if "cluster" in l or "error" in l.lower()]
                for l in lines[-12:]:
                    print(f"        {name}| {l}")
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)
        write_config(stage, "")
    print("        two daemons on one Redis (0 = the systemd one, 1 = the host one): event, systemctl time, relay latency of the frames "
          "sent around it, EOF, RST, lost deliveries by sender's -> receiver's daemon, duplicated, missed after READY=1, PUBSUB NUMSUB")
    print("        | event | systemctl | p99 | max | frames | EOF | RST | lost 0->0 | lost 0->1 | lost 1->0 | lost 1->1 | dup | missed after READY=1 | NUMSUB |")
    print("        |---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, took, p99, worst, n, eof, rst, lost, dup, late, subs in rows:
        ls = " | ".join(str(lost.get(k, 0)) for k in ((0, 0), (0, 1), (1, 0), (1, 1)))
        print(f"        | {label} | {took * 1000:.0f} ms | {p99:.1f} ms | {worst:.1f} ms | {n} | {eof} | {rst} | {ls} | {dup} | {late} | "
              f"{' '.join(str(v) for v in subs.values())} |")
