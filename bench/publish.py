#!/usr/bin/env python3
"""Publishes per second through the backend API (docs/api.md) into one room.

A release roomcastd with `[api]` on loopback; MEMBERS LTB members join room
`bench` and drain their sockets (one process, epoll); CONNECTIONS keep-alive
HTTP/1.1 connections each POST /v1/rooms/bench/publish in a closed loop (one
request outstanding per connection), text bodies of about 64 bytes, for
SECONDS after a 1 s warm-up. Publishes/s are the answers received;
members drain in a process of their own; deliveries/s come from the daemon's own count, GET /metrics
roomcast_frames_delivered_total{type="text"} before and after.

    bench/publish.py --roomcastd .build-bench/release/roomcastd [--members 1000]
                     [--connections 1,4] [--seconds 5]

Prints one Markdown row per connection count. Loopback only; bounded in
time and in descriptors (members + connections + a few, under the 20,000 limit).
"""
import argparse, json, multiprocessing, os, re, select, signal, socket, subprocess, sys, tempfile, threading, time

KEY = "bench-key-0123456789abcdef"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ltb_join(room, name):
    def field(tag, data):
        return bytes([tag, len(data)]) + data
    body = bytes([0x08, 1]) + field(0x12, name.encode()) + field(0x1A, b"") + field(0x22, room.encode())
    return len(body).to_bytes(4, "little") + (0).to_bytes(2, "little") + body


class API:
    """One keep-alive connection; `post` returns the body of the answer."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, method, path, body=b""):
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.s.sendall(head + body)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                m = re.search(rb"(?i)content-length:\s*(\d+)", self.buf[:end])
                n = int(m.group(1)) if m else 0
                if len(self.buf) >= end + 4 + n:
                    status = int(self.buf[9:12])
                    out = self.buf[end + 4:end + 4 + n]
                    self.buf = self.buf[end + 4 + n:]
                    return status, out
            chunk = self.s.recv(65536)
            if not chunk:
                raise RuntimeError("the API closed the connection")
            self.buf += chunk


def delivered_text(port):
    _, body = API(port).request("GET", "/metrics")
    m = re.search(rb'roomcast_frames_delivered_total\{type="text"\} (\d+)', body)
    return int(m.group(1))


def drain_members(port, members):
    """In a process of its own (the publishers' GIL is not its to take): join, then read and discard until killed."""
    socks = []
    for i in range(members):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(ltb_join("bench", f"m{i}"))
        s.setblocking(False)
        socks.append(s)
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
    by_fd = {s.fileno(): s for s in socks}
    buf = bytearray(1 << 18)
    while True:
        for fd, _ in ep.poll(1.0):
            try:
                while by_fd[fd].recv_into(buf) == len(buf):
                    pass
            except BlockingIOError:
                pass


def run(port, connections, seconds):
    body = json.dumps({"type": "text", "user": {"name": "backend", "level": 1, "icon": ""},
                       "text": "x" * 48}).encode()
    counts = [0] * connections
    phase = {"measure": False, "stop": False}

    def publisher(i):
        api = API(port)
        while not phase["stop"]:
            status, _ = api.request("POST", "/v1/rooms/bench/publish", body)
            if status != 200:
                raise RuntimeError(f"publish answered {status}")
            if phase["measure"]:
                counts[i] += 1

    threads = [threading.Thread(target=publisher, args=(i,), daemon=True) for i in range(connections)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # warm-up
    d0 = delivered_text(port)
    t0 = time.monotonic()
    phase["measure"] = True
    time.sleep(seconds)
    phase["measure"] = False
    t1 = time.monotonic()
    d1 = delivered_text(port)
    phase["stop"] = True
    for t in threads:
        t.join(timeout=5)
    return sum(counts) / (t1 - t0), (d1 - d0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roomcastd", required=True)
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--connections", default="1,4")
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    assert a.members + 64 < 19000, "stay under the 20,000 descriptor limit"
    tmp = tempfile.mkdtemp(prefix="roomcast-publish-")
    keys = os.path.join(tmp, "api.keys")
    with open(keys, "w") as f:
        f.write(KEY + "\n")
    os.chmod(keys, 0o600)
    port, api_port = free_port(), free_port()
    conf = os.path.join(tmp, "roomcastd.conf")
    with open(conf, "w") as f:
        f.write(f"[server]\nlisten = 127.0.0.1:{port}\nmax_clients = 19900\n[protocol]\necho = no\n"
                f"[heartbeat]\ntimeout = 0\n[log]\nlevel = warning\ntarget = stderr\nstats_interval = 0\n"
                f"[rooms]\ncounts = 0\n[api]\nlisten = 127.0.0.1:{api_port}\nkey_file = {keys}\n")
    daemon = subprocess.Popen([a.roomcastd, "--config", conf], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                API(api_port).request("GET", "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        drainer = multiprocessing.Process(target=drain_members, args=(port, a.members), daemon=True)
        drainer.start()
        deadline = time.monotonic() + 30
        while b'"viewers": %d' % a.members not in API(api_port).request("GET", "/v1/rooms/bench?limit=1")[1]:
            if time.monotonic() > deadline:
                raise RuntimeError("the members did not all join")
            time.sleep(0.05)
        print("| API connections | members | publishes/s | deliveries/s |")
        print("|---|---|---|---|")
        for n in [int(x) for x in a.connections.split(",")]:
            pubs, deliveries = run(api_port, n, a.seconds)
            print(f"| {n} | {a.members} | {pubs:,.0f} | {deliveries:,.0f} |", flush=True)
        drainer.terminate()
        drainer.join(timeout=5)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()


if __name__ == "__main__":
    main()
