"""The systemd suite's harness: the container (nsenter), the journal, a TCP client, the
suite's checks and the state one section leaves for the next.

Part of systemd/test-systemd.py (its docstring says what the suite changes and why)."""
import json
import os
import socket
import struct
import subprocess
import time
import traceback

PID1 = os.environ.get("SANDBOX_PID1")

UNIT = "roomcastd.service"

CONF = "/etc/roomcast/roomcastd.conf"

# Where the package puts the binaries (relative to the container's root).
BINDIR = "usr/bin"

UNITS = ("roomcastd.service", "roomcastd-standalone.service", "roomcastd.socket", "roomcastd-json.socket",
         "roomcastd-websocket.socket")

# The package's files that make install lays out too, as (package path, make install path
# under PREFIX=/usr/local); the package adds only /usr/share/doc/roomcast.
PACKAGE_FILES = ([(f"usr/bin/{b}", f"usr/local/bin/{b}") for b in ("roomcastd", "roomcast")]
                 + [(f"lib/systemd/system/{u}", f"usr/local/lib/systemd/system/{u}") for u in UNITS]
                 + [(f"usr/share/man/{m}.gz", f"usr/local/share/man/{m}")
                    for m in ("man8/roomcastd.8", "man5/roomcastd.conf.5", "man1/roomcast.1")]
                 + [(f"usr/share/roomcast/web/{w}", f"usr/local/share/roomcast/web/{w}")
                    for w in ("index.html", "chat.css", "chat.js")]
                 + [("etc/roomcast/roomcastd.conf", "etc/roomcast/roomcastd.conf")])

WATCHDOG_SEC = 2

# From the installed unit.
RESTART_SEC = 0.1

OPAQUE = 100        # a frame type the daemon relays without looking at it

HEARTBEAT = 8

TEXT = 2

JOIN = 0


def run(*argv, check=True, timeout=30, input=None):
    """Runs argv inside the container; returns the CompletedProcess."""
    p = subprocess.run(["nsenter", "-t", PID1, "-a", "--", *argv], input=input,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def write_file(path, text):
    run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path, input=text)


def show(unit, *props):
    """`systemctl show -p ...` as a dict."""
    out = run("systemctl", "show", unit, *[f"-p{p}" for p in props]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cursor():
    """A mark in the journal: the receive time (monotonic, µs) of the newest record.

    journal(after=...) filters on it in Python: journalctl's --after-cursor
    combined with field matches missed records here (the dynamic user's
    records live in a journal file of their own)."""
    out = run("journalctl", "-n1", "-ojson", "--no-pager").stdout.strip()
    return int(json.loads(out)["__MONOTONIC_TIMESTAMP"]) if out else 0


def journal(*args, after=None):
    """Records of `journalctl -u roomcastd ARGS` as dicts (MESSAGE as text),
    only those received after the mark `after` when it is given."""
    records = []
    for line in run("journalctl", "-u", UNIT, "-ojson", "--no-pager", *args).stdout.splitlines():
        r = json.loads(line)
        if after is not None and int(r["__MONOTONIC_TIMESTAMP"]) <= after:
            continue
        if isinstance(r.get("MESSAGE"), list):
            r["MESSAGE"] = bytes(r["MESSAGE"]).decode(errors="replace")
        records.append(r)
    return records


def eventually(fn, timeout=5.0, interval=0.1):
    """Calls fn until it returns a true value or timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def messages(records):
    return [r.get("MESSAGE", "") for r in records]


def find(records, substring):
    return [r for r in records if substring in r.get("MESSAGE", "")]


class Client:
    """One TCP client speaking little-endian length-type-body frames."""

    def __init__(self, port, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        host, lport = self.sock.getsockname()
        self.addr = f"{host}:{lport}"   # as the daemon logs it in CLIENT_ADDR
        self.buf = b""

    def send(self, type_, body=b""):
        self.sock.sendall(struct.pack("<IH", len(body), type_) + body)

    def _fill(self, n, timeout):
        self.sock.settimeout(timeout)
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"{self.addr}: connection closed by the daemon")
            self.buf += chunk

    def recv(self, timeout=5):
        """The next frame as (type, body)."""
        self._fill(6, timeout)
        length, type_ = struct.unpack("<IH", self.buf[:6])
        self._fill(6 + length, timeout)
        body, self.buf = self.buf[6:6 + length], self.buf[6 + length:]
        return type_, body

    def closed_by_peer(self, timeout=5):
        """True when the daemon closed the connection and nothing is left to read."""
        try:
            self._fill(len(self.buf) + 1, timeout)
        except EOFError:
            return not self.buf
        return False

    def close(self):
        self.sock.close()


class Suite:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.started = time.monotonic()

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"  ok    {name}", flush=True)
        else:
            self.failed += 1
            print(f"  FAIL  {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def section(self, title, fn, *args):
        print(f"\n== {title}", flush=True)
        t0 = time.monotonic()
        try:
            fn(self, *args)
        except Exception as e:  # one broken step must not hide the others
            self.check(f"{title}: ran to the end", False, f"{type(e).__name__}: {e}")
            traceback.print_exc(limit=3)
        print(f"   ({time.monotonic() - t0:.1f} s)", flush=True)

    def summary(self):
        elapsed = time.monotonic() - self.started
        print(f"\nsystemd suite: {self.passed} passed, {self.failed} failed ({elapsed:.1f} s)", flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class State:
    """What one section leaves for the next."""
    port = None
    clients = {}


def write_test_dropins():
    """The suite's drop-ins (see the module's comment); State.port is the socket's port."""
    State.port = State.port or free_port()
    write_file("/etc/systemd/system/roomcastd.socket.d/test.conf",
               f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{State.port}\n")
    write_file("/etc/systemd/system/roomcastd.service.d/test.conf", f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\n")


def apt(*argv, timeout=180):
    """apt inside the container, non-interactive; returns the CompletedProcess."""
    return run("env", "DEBIAN_FRONTEND=noninteractive", "apt", "-y", *argv, check=False, timeout=timeout)


def package_status():
    p = run("dpkg-query", "-W", "-f", "${Status}", "roomcast", check=False)
    return p.stdout.strip() if p.returncode == 0 else "not known to dpkg"

GOOD_RELOAD = "[protocol]\necho = no\n\n[log]\nlevel = debug\n"

API_SOCKET = "/run/roomcastd/api.sock"

TLS_DIR = "/etc/roomcast/tls"

CREDENTIALS = "/run/credentials/roomcastd.service"

TLS_CONFIG = f"[tls]\ncert_file = {CREDENTIALS}/cert.pem\nkey_file = {CREDENTIALS}/key.pem\n"

TLS_SOCKETS = (("roomcastd-test-tls.socket", "tls", "ltb+tls"), ("roomcastd-test-json-tls.socket", "json-tls", "json+tls"),
               ("roomcastd-test-websocket-tls.socket", "websocket-tls", "websocket+tls"))

HAPROXY = "/usr/sbin/haproxy"

HAPROXY_DIR = "/etc/roomcast/haproxy"

HANDOVER_CLIENTS, HANDOVER_ROOMS, HANDOVER_RATE = 1000, 10, 0.2

NOTICE = 9

# The second of two restarts comes 50 ms after the first one's new process
# started (while it restores, before READY=1: systemd sends that SIGTERM
# without ExecStop=); every SIGTERM hands over, so the clients stay. False
# runs the second restart 2 s after the first (two plain restarts), for a
# daemon that tells a restart from a stop with an ExecStop= hook, which
# drops every client in the 50 ms case.
CLUSTER_RESTARTS_50MS_APART = True

CLUSTER_NAME = "systemdtest"

CLUSTER_CLIENTS, CLUSTER_ROOMS, CLUSTER_RATE = 1000, 10, 0.2

# Redis's Unix socket, in the container's /run: the socket-activated unit has no
# network of its own (PrivateNetwork=yes), AF_UNIX it has.
CLUSTER_SOCKET_DIR = "/run/roomcast-test-redis"

# [cluster] restart_grace of the systemd daemon (the default).
CLUSTER_RESTART_GRACE = 1.0
