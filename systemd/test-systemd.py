#!/usr/bin/env python3
"""roomcastd under a real systemd 252: the life cycle an operator sees.

Run by `make test-systemd` through systemd/sandbox, which boots systemd as
PID 1 of a container (SANDBOX_PID1) on a pristine Debian 12 root. The suite
installs the Debian package into it with `apt install ./roomcast_...deb`, as
an operator does, and ends with `apt remove` and `apt purge`; the files it
edits (the config, the binary for the upgrade) it reaches from the host
through /proc/PID1/root. `make install` is checked beside it: its tree
(--install-stage) must hold the package's files under /usr/local. Every
systemctl/journalctl call runs inside the container (nsenter); every client
is a real TCP socket from the host over loopback (the container shares the
host's network).

What the suite changes in the container, and why:
- roomcastd.socket.d/test.conf: a free loopback port instead of 9898, which
  another program on this machine may hold (written before the install, so
  that the package's postinst starts the socket on it);
- roomcastd.service.d/test.conf: WatchdogSec=2s instead of 10s, so that the
  watchdog test takes seconds. Everything else is the installed unit.

The checks follow the service's life cycle in order; later ones build on the
state earlier ones leave (a running service, connected clients). A failed
check is reported and the suite goes on where it can.
"""
import argparse
import os
import socket
import sys
import time
from chatpool import ChatPool
from sdharness import (
    BINDIR,
    CONF,
    Client,
    HEARTBEAT,
    OPAQUE,
    PACKAGE_FILES,
    PID1,
    State,
    Suite,
    UNIT,
    UNITS,
    apt,
    free_port,
    package_status,
    run,
    show,
)
from sd_service import (
    test_install,
    test_journal,
    test_make_install,
    test_reload,
    test_socket_activation,
    test_status,
    test_stop,
    test_stray_usr2_then_stop,
    test_watchdog,
    write_config,
)
from sd_listeners import test_api_socket, test_json_socket, test_websocket_socket
from sd_tls import test_haproxy_restart, test_tls_sockets
from sd_handover import during, test_budget, test_handover, test_positions_restart
from sd_cluster import test_cluster_handover


def test_verify(t):
    """Item 7: systemd-analyze verify prints nothing for the units; security scores."""
    p = run("systemd-analyze", "verify", "--man=no", "roomcastd.socket", "roomcastd-json.socket", "roomcastd-websocket.socket", UNIT,
            "roomcastd-standalone.service", check=False)
    out = (p.stdout + p.stderr).strip()
    t.check("systemd-analyze verify (installed units, inside the container) prints nothing", out == "" and p.returncode == 0, out)
    for unit, limit in ((UNIT, 1.0), ("roomcastd-standalone.service", 1.5)):
        p = run("systemd-analyze", "security", "--no-pager", unit, check=False)
        score = [l for l in p.stdout.splitlines() if "Overall exposure level" in l]
        value = float(score[0].split(":")[1].split()[0]) if score else 99.0
        t.check(f"systemd-analyze security {unit}: {value} <= {limit}", value <= limit, p.stderr.strip())


def test_standalone(t, stage):
    """The self-binding unit under the same sandbox minus the network keys."""
    port = free_port()
    write_config(stage, f"[server]\nlisten = 127.0.0.1:{port}\n")
    p = run("systemctl", "start", "roomcastd-standalone.service", check=False)
    t.check("systemctl start roomcastd-standalone.service", p.returncode == 0, p.stderr.strip() + "\n"
            + run("journalctl", "-u", "roomcastd-standalone.service", "-n", "15", "--no-pager", check=False).stdout)
    t.check("it stopped the conflicting roomcastd.socket",
            show("roomcastd.socket", "ActiveState")["ActiveState"] == "inactive")
    a, b = Client(port), Client(port)
    a.send(OPAQUE, b"standalone")
    t.check("it binds [server] listen itself and serves", b.recv() == (OPAQUE, b"standalone"))
    # A restart of the self-binding unit keeps its clients too.
    pool = ChatPool(port, clients=100, rooms=5, rate=1.0)
    try:
        pool.connect()
        pool.join()
        pool.start_chat()
        pid = show("roomcastd-standalone.service", "MainPID")["MainPID"]
        p, t0, t1 = during(pool, ["systemctl", "restart", "roomcastd-standalone.service"], after=2.0)
        late = Client(port)  # the listener stayed open (kept in the fd store) and the new process serves
        late.send(HEARTBEAT)
        pool.run(1)
        pool.drain()
        eof, rst = pool.closed()
        t.check("systemctl restart roomcastd-standalone.service: a new process", p.returncode == 0
                and show("roomcastd-standalone.service", "MainPID")["MainPID"] not in (pid, "0"), p.stderr.strip())
        t.check(f"and 100 chatting clients kept: {eof} EOF, {rst} RST, {pool.lost()} lost, {pool.duplicates} duplicated",
                eof == rst == pool.lost() == pool.duplicates == pool.skipped == 0)
        _, p99, worst, _ = pool.window(t0 - 0.5, t1 + 1.0)
        print(f"        standalone restart: systemctl took {(t1 - t0) * 1000:.0f} ms, relay latency around it p99 {p99:.1f} ms, max {worst:.1f} ms")
        late.close()
    finally:
        pool.close()
    t0 = time.monotonic()
    run("systemctl", "stop", "roomcastd-standalone.service")
    s = show("roomcastd-standalone.service", "Result", "ExecMainStatus")
    t.check("and stops gracefully", s == {"Result": "success", "ExecMainStatus": "0"} and time.monotonic() - t0 < 3, str(s))
    a.close()
    b.close()


def test_package_upgrade_remove_purge(t, stage, deb):
    """The package's upgrade, remove and purge: `apt install --reinstall` restarts a
    running daemon on the new binary with its clients kept (the postinst's try-restart);
    `apt remove` stops the sockets and the daemon and keeps the conffile; `apt purge`
    leaves nothing: no config, units, enablement links or deb-systemd-helper state."""
    name = os.path.basename(deb)
    write_config(stage, "")
    run("systemctl", "start", "roomcastd.socket")  # the standalone test stopped it (Conflicts=)
    pool = ChatPool(State.port, clients=100, rooms=5, rate=1.0)
    try:
        pool.connect()
        pool.join()
        pool.start_chat()
        pid = show(UNIT, "MainPID")["MainPID"]
        p, t0, t1 = during(pool, ["sh", "-c", f'cd /tmp && DEBIAN_FRONTEND=noninteractive apt install -y --reinstall "./{name}"'],
                           after=2.0)
        pool.drain()
        eof, rst = pool.closed()
        after = show(UNIT, "MainPID", "ActiveState")
        t.check(f"apt install --reinstall ./{name} (an upgrade to dpkg: prerm upgrade, postinst configure OLD)",
                p.returncode == 0, p.stderr.strip() or p.stdout[-400:])
        t.check(f"the postinst restarted the running daemon (PID {pid} -> {after['MainPID']})",
                after["MainPID"] not in (pid, "0") and after["ActiveState"] == "active", str(after))
        exe = run("stat", "-L", "-c", "%i", f"/proc/{after['MainPID']}/exe", check=False).stdout.strip()
        t.check("the new process runs the file dpkg unpacked", exe == str(os.stat(os.path.join(stage, BINDIR, "roomcastd")).st_ino))
        t.check(f"and 100 chatting clients kept: {eof} EOF, {rst} RST, {pool.lost()} lost, {pool.duplicates} duplicated",
                eof == rst == pool.lost() == pool.duplicates == pool.skipped == 0)
        _, p99, worst, _ = pool.window(t0 - 0.5, t1 + 1.0)
        print(f"        package upgrade: apt took {(t1 - t0) * 1000:.0f} ms, relay latency around it p99 {p99:.1f} ms, max {worst:.1f} ms")
    finally:
        pool.close()

    # An enablement the operator made: purge must remove it too.
    run("systemctl", "enable", "roomcastd-json.socket")
    # The suite's own drop-ins are the operator's files, not the package's: dpkg leaves them.
    run("rm", "-rf", *[f"/etc/systemd/system/{u}.d" for u in UNITS])
    run("systemctl", "daemon-reload")

    p = apt("remove", "roomcast")
    t.check("apt remove roomcast", p.returncode == 0, p.stderr.strip() or p.stdout[-400:])
    active = {u: show(u, "ActiveState")["ActiveState"] for u in UNITS}
    t.check("the prerm stopped the sockets and the daemon", set(active.values()) == {"inactive"}, str(active))
    left = run("pgrep", "-x", "roomcastd", check=False).stdout.split()
    t.check("no roomcastd process is left", left == [], str(left))
    try:
        socket.create_connection(("127.0.0.1", State.port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    t.check(f"nothing listens on 127.0.0.1:{State.port} any more", refused)
    gone = [path for path, _ in PACKAGE_FILES if not path.startswith("etc/") and os.path.lexists(os.path.join(stage, path))]
    t.check("the binaries, units and man pages are gone", gone == [], str(gone))
    t.check(f"the conffile {CONF} is kept until purge",
            os.path.isfile(os.path.join(stage, CONF.lstrip("/"))) and package_status() == "deinstall ok config-files",
            package_status())

    p = apt("purge", "roomcast")
    t.check("apt purge roomcast", p.returncode == 0, p.stderr.strip() or p.stdout[-400:])
    t.check("dpkg no longer knows the package", package_status() == "not known to dpkg", package_status())
    t.check("no /etc/roomcast", not os.path.lexists(os.path.join(stage, "etc/roomcast")))
    found = run("find", "/etc", "/lib", "/usr", "/var", "-xdev", "-name", "*roomcast*", check=False).stdout.split()
    t.check("nothing named roomcast under /etc, /lib, /usr, /var (units, enablement links, "
            "deb-systemd-helper state, dpkg's records)", found == [], str(found))
    loaded = {u: show(u, "LoadState")["LoadState"] for u in UNITS}
    t.check("systemd knows none of the units any more", set(loaded.values()) == {"not-found"}, str(loaded))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deb", required=True, help="the package (host path) to apt install in the container")
    ap.add_argument("--install-stage", required=True, help="a make install DESTDIR tree (PREFIX=/usr/local) to compare")
    ap.add_argument("--stage", help="the container's root as the host sees it (default: /proc/PID1/root)")
    args = ap.parse_args()
    if not PID1:
        sys.exit("test-systemd.py: run me through systemd/sandbox (SANDBOX_PID1 is not set)")
    args.stage = args.stage or f"/proc/{PID1}/root"
    t = Suite()
    t.section(f"install: apt install ./{os.path.basename(args.deb)}", test_install, args.stage, args.deb)
    t.section("make install: the package's files under /usr/local", test_make_install, args.stage, args.install_stage)
    t.section("1. socket activation", test_socket_activation)
    if State.port:
        t.section("2. status and StatusText", test_status)
        t.section("3. journal", test_journal)
        t.section("4. reload", test_reload, args.stage)
        t.section("5. watchdog", test_watchdog)
        t.section("6. graceful stop", test_stop, args.stage)
        t.section("JSON listener through roomcastd-json.socket", test_json_socket, args.stage)
        t.section("WebSocket listener through roomcastd-websocket.socket", test_websocket_socket, args.stage)
        t.section("the API's Unix socket across a restart", test_api_socket, args.stage)
        t.section("TLS listeners through sockets named tls, json-tls, websocket-tls; the key by LoadCredential=",
                  test_tls_sockets, args.stage)
        t.section("HAProxy (TLS, PROXY v2) in front: systemctl restart keeps the proxied clients and their addresses",
                  test_haproxy_restart, args.stage)
        t.section("restarts, an upgrade and a crash keep every client", test_handover, args.stage)
        t.section("positions and recent lines across systemctl restart", test_positions_restart, args.stage)
        t.section("a stray SIGUSR2, then systemctl stop: a real stop", test_stray_usr2_then_stop)
        t.section("LimitNOFILE= lowered: the budget does not hold", test_budget)
        t.section("two daemons on one Redis: restarts and a crash keep every client and every room on the cluster",
                  test_cluster_handover, args.stage, args.install_stage)
    t.section("7. systemd-analyze verify and security", test_verify)
    t.section("self-binding roomcastd-standalone.service", test_standalone, args.stage)
    t.section("the package: upgrade, apt remove, apt purge", test_package_upgrade_remove_purge, args.stage, args.deb)
    sys.exit(t.summary())


if __name__ == "__main__":
    main()
