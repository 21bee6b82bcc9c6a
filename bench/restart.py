#!/usr/bin/env python3
"""make bench-restart: N chatting clients across a `systemctl restart` and a
`systemctl kill -s SIGKILL` of roomcastd under a real systemd 252 (docs/operations/restarts.md, restarts).

Run through systemd/sandbox (SANDBOX_PID1 set), as `make test-systemd` is:
the installed units, the socket on a free loopback port, the clients in this
process on the host (chatpool.py). Prints one markdown table: per event the
gap (p99 and max relay latency of the frames sent around it), how long
systemctl took, the restore the journal reports, PID 1's CPU, and what the
clients saw (EOF, RST, lost, duplicated or reordered frames).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "systemd"))
from chatpool import ChatPool, pid_cpu_seconds  # noqa: E402

PID1 = os.environ.get("SANDBOX_PID1")
UNIT = "roomcastd.service"


def run(*argv, check=True, timeout=120):
    p = subprocess.run(["nsenter", "-t", PID1, "-a", "--", *argv], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def write_file(path, text):
    subprocess.run(["nsenter", "-t", PID1, "-a", "--", "sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path],
                   input=text, text=True, check=True)


def show(*props):
    out = run("systemctl", "show", UNIT, *[f"-p{p}" for p in props]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal_after(mark):
    out = run("journalctl", "-u", UNIT, "-ojson", "--no-pager").stdout
    recs = [json.loads(line) for line in out.splitlines()]
    return [r for r in recs if int(r["__MONOTONIC_TIMESTAMP"]) > mark]


def cursor():
    out = run("journalctl", "-n1", "-ojson", "--no-pager").stdout.strip()
    return int(json.loads(out)["__MONOTONIC_TIMESTAMP"]) if out else 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event(pool, label, argv, settle, perf=None, split=()):
    profiler = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "1999", "-o", perf, "--", "sleep", "2"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if perf else None
    if profiler:
        time.sleep(0.3)
    b50, b99, bmax, bn = pool.window(time.monotonic() - 3, time.monotonic())
    print(f"# {label}: relay latency in the 3 s before: p50 {b50:.1f} ms, p99 {b99:.1f} ms, max {bmax:.1f} ms ({bn} deliveries)", flush=True)
    mark = cursor()
    pid = show("MainPID")["MainPID"]
    lost0, dup0, got0, exp0 = pool.lost(), pool.duplicates, pool.deliveries(), pool.expected()
    pool.split_next(split)  # half a frame each, completed once the new process has restored them
    cpu0 = pid_cpu_seconds(PID1)
    out = {}

    def go():
        out["t0"] = time.monotonic()
        out["p"] = run(*argv, check=False)
        out["t1"] = time.monotonic()
    pool.next_send = time.monotonic()  # no burst of the frames due while this thread was busy above
    worker = threading.Thread(target=go)
    worker.start()
    while worker.is_alive():
        pool.run(0.02)
    worker.join()
    if profiler:
        profiler.wait()
    # Until the new process has restored everyone (a crash restarts after RestartSec=).
    deadline = time.monotonic() + 60
    restored = ""
    while time.monotonic() < deadline and not restored:
        pool.run(0.5)
        for r in journal_after(mark):
            m = r.get("MESSAGE", "")
            if isinstance(m, list):
                m = bytes(m).decode(errors="replace")
            if m.startswith("restored "):
                restored = m
    pool.complete_split()
    pool.run(settle)
    cpu1 = pid_cpu_seconds(PID1)
    pool.drain(settle=1.0, timeout=60)
    p50, p99, worst, n = pool.window(out["t0"] - 0.5, out["t1"] + 1.0)
    eof, rst = pool.closed()
    row = {
        "event": label, "systemctl_ms": round((out["t1"] - out["t0"]) * 1000), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
        "max_ms": round(worst, 1), "frames": n, "pid1_cpu_ms": round((cpu1 - cpu0) * 1000), "restored": restored,
        "eof": eof, "rst": rst, "lost": pool.lost() - lost0, "duplicated_or_reordered": pool.duplicates - dup0,
        "deliveries": pool.deliveries() - got0, "expected": pool.expected() - exp0,
        "new_pid": show("MainPID")["MainPID"] != pid, "rc": out["p"].returncode,
    }
    print(json.dumps(row), flush=True)
    gone = [m for m in pool.missing() if m[0] >= out["t0"] - 10]
    if gone:
        rel = [(t - out["t0"]) * 1000 for t, *_ in gone]
        print(f"# {len(gone)} frames not delivered to every member ({sum(m[3] for m in gone)} deliveries), sent between "
              f"{min(rel):.0f} and {max(rel):.0f} ms after the event began; from {len({m[1] for m in gone})} senders", flush=True)
    recs = journal_after(mark)
    first = int(recs[0]["__MONOTONIC_TIMESTAMP"]) if recs else 0
    for r in recs:
        m = r.get("MESSAGE", "")
        m = bytes(m).decode(errors="replace") if isinstance(m, list) else m
        if "loopback" not in m:
            print(f"#   +{(int(r['__MONOTONIC_TIMESTAMP']) - first) / 1000:7.1f} ms  {r.get('SYSLOG_IDENTIFIER', '?')}: {m}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rooms", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.02, help="chat frames per second per client")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of chat after each event")
    ap.add_argument("--markdown", help="write the table here too")
    ap.add_argument("--perf", help="record `perf record -a -g` around the restart into this file (a profiling aid)")
    args = ap.parse_args()
    if not PID1:
        sys.exit("bench/restart.py: run me through systemd/sandbox (SANDBOX_PID1 is not set)")
    port = free_port()
    write_file("/etc/systemd/system/roomcastd.socket.d/bench.conf", f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n")
    # The clients' joins and chat stay under the default limits; max_clients above the bench's.
    write_file("/etc/roomcast/roomcastd.conf", f"[server]\nmax_clients = {args.clients + 100}\n")
    run("systemctl", "daemon-reload")
    run("systemctl", "start", "roomcastd.socket")
    nofile = run("sh", "-c", "ulimit -Hn").stdout.strip()
    print(f"# {args.clients} clients in {args.rooms} rooms, {args.rate} frames/s each; container hard RLIMIT_NOFILE {nofile}, "
          f"host {os.sysconf('SC_OPEN_MAX')}", flush=True)
    pool = ChatPool(port, clients=args.clients, rooms=args.rooms, rate=args.rate)
    t0 = time.monotonic()
    pool.connect()
    pool.join(settle=2.0, timeout=300)
    print(f"# connected and joined in {time.monotonic() - t0:.1f} s; StatusText: {show('StatusText')['StatusText']}", flush=True)
    pool.start_chat()
    pool.run(args.settle)
    rows = []
    pool.start_chat()
    rows.append(event(pool, "systemctl restart", ["systemctl", "restart", UNIT], args.settle, perf=args.perf,
                      split=pool.members[::max(1, args.clients // 20)]))
    pool.start_chat()
    rows.append(event(pool, "SIGKILL (crash)", ["systemctl", "kill", "-s", "SIGKILL", UNIT], args.settle,
                      split=pool.members[::max(1, args.clients // 20)]))
    pool.close()

    lines = [f"{args.clients} clients in {args.rooms} rooms ({args.rate} frames/s each) under systemd 252 in systemd-nspawn, "
             f"{time.strftime('%Y-%m-%d')}:", "",
             "| event | gap: p99 / max relay latency | systemctl | restore (journal) | PID 1 CPU | EOF / RST | lost / duplicated |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['event']} | {r['p99_ms']} / {r['max_ms']} ms ({r['frames']} frames) | {r['systemctl_ms']} ms | "
                     f"{r['restored'] or 'none'} | {r['pid1_cpu_ms']} ms | {r['eof']} / {r['rst']} | "
                     f"{r['lost']} / {r['duplicated_or_reordered']} of {r['expected']} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    ok = all(r["eof"] == r["rst"] == r["duplicated_or_reordered"] == 0 and r["new_pid"] and r["restored"] for r in rows) \
        and rows[0]["lost"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
