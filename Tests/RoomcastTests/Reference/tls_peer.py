#!/usr/bin/env python3
"""TLS peers for TLSIntegrationTests.swift, against a real roomcastd speaking the
JSON dialect (docs/protocol/json.md §7) on its listeners. argv[1] names the case,
argv[2] is a JSON object of its parameters; the case prints one JSON object.
Every socket has a timeout and every loop a deadline: bounded in time.

Cases:
  chat      two TLS clients and a plain one in one room; a large message too
  hostile   plaintext, a stalled handshake, TLS 1.0, a renegotiation, each
            while two good TLS clients keep chatting
  proxy     PROXY v1 header and the ClientHello in one segment, then TLS
  reload    N TLS clients in rooms chatting; SIGHUP with a new certificate in
            the middle; all must stay and new clients see the new certificate
  connect   one handshake: the certificate's serial, or the error
"""
import json, os, selectors, signal, socket, ssl, struct, subprocess, sys, time

case, params = sys.argv[1], json.loads(sys.argv[2])
HOST = "127.0.0.1"


def context(cafile, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=cafile)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack("<I", len(body)) + body


class Reader:
    """Cuts JSON frames from a stream."""
    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            n = struct.unpack("<I", self.buf[:4])[0]
            if len(self.buf) < 4 + n:
                break
            out.append(json.loads(self.buf[4:4 + n]))
            self.buf = self.buf[4 + n:]
        return out


def tls_client(port, ctx, timeout=10):
    raw = socket.create_connection((HOST, port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def recv_until(sock, reader, pred, timeout=10):
    """Frames until one satisfies pred (returned with all before it), or timeout."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (socket.timeout, ssl.SSLWantReadError):
            break
        except (ssl.SSLError, OSError) as e:
            got.append({"error": str(e)})
            break
        if not data:
            got.append({"eof": True})
            break
        for m in reader.feed(data):
            got.append(m)
            if pred(m):
                return got
    return got


def closed_within(sock, timeout):
    """Seconds until the far end closed `sock` (EOF or reset), or None."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return time.monotonic() - start
    except socket.timeout:
        return None
    except OSError:
        return time.monotonic() - start


def good_pair(port, ctx, room):
    a, b = tls_client(port, ctx), tls_client(port, ctx)
    ra, rb = Reader(), Reader()
    a.sendall(frame({"cmd": "nickname", "nickname": "alice", "room": room}))
    recv_until(a, ra, lambda m: m.get("cmd") == "join" and m.get("nickname") == "alice")
    b.sendall(frame({"cmd": "nickname", "nickname": "bob", "room": room}))
    recv_until(a, ra, lambda m: m.get("cmd") == "join" and m.get("nickname") == "bob")
    recv_until(b, rb, lambda m: m.get("cmd") == "join" and m.get("nickname") == "bob")
    return (a, ra), (b, rb)


def still_chatting(pair, text):
    (a, ra), (b, rb) = pair
    a.sendall(frame({"cmd": "msg", "content": text}))
    got = recv_until(b, rb, lambda m: m.get("content") == text, timeout=5)
    return any(m.get("content") == text for m in got)


if case == "chat":
    ctx = context(params["ca"])
    a, b = tls_client(params["tls"], ctx), tls_client(params["tls"], ctx)
    c = socket.create_connection((HOST, params["plain"]), timeout=10)
    ra, rb, rc = Reader(), Reader(), Reader()
    for s, r, name in [(a, ra, "alice"), (b, rb, "bob"), (c, rc, "carol")]:
        s.sendall(frame({"cmd": "nickname", "nickname": name, "room": "tlsroom"}))
        recv_until(s, r, lambda m, name=name: m.get("cmd") == "join" and m.get("nickname") == name)
    big = "x" * 40000  # three TLS records each way
    a.sendall(frame({"cmd": "msg", "content": "hello"}) + frame({"cmd": "msg", "content": big}))
    got_b = recv_until(b, rb, lambda m: m.get("content") == big)
    got_c = recv_until(c, rc, lambda m: m.get("content") == big)
    c.sendall(frame({"cmd": "msg", "content": "back"}))
    got_a = recv_until(a, ra, lambda m: m.get("content") == "back")
    short = lambda ms: [(m.get("cmd"), m.get("from"), len(m.get("content", ""))) for m in ms if m.get("cmd") == "msg"]
    print(json.dumps({"version": a.version(), "b": short(got_b), "c": short(got_c), "a": short(got_a)}))

elif case == "hostile":
    ctx = context(params["ca"])
    port = params["tls"]
    pair = good_pair(port, ctx, "calm")
    out = {"before": still_chatting(pair, "before")}
    # Plaintext to a TLS port: a JSON frame where a ClientHello should be.
    p = socket.create_connection((HOST, port), timeout=10)
    p.sendall(frame({"cmd": "nickname", "nickname": "plain"}))
    out["plaintext_closed_s"] = closed_within(p, 5)
    # A handshake that never completes: half a ClientHello, then silence.
    stall = socket.create_connection((HOST, port), timeout=10)
    stall.sendall(bytes.fromhex("160301020001"))
    out["stall_closed_s"] = closed_within(stall, params["timeout_s"] + 5)
    out["during"] = still_chatting(pair, "during")
    # TLS 1.0 offered, and nothing newer.
    r = subprocess.run(["openssl", "s_client", "-connect", "%s:%d" % (HOST, port), "-tls1"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    out["tls10_refused"] = "alert protocol version" in r.stdout + r.stderr
    out["tls10_output"] = (r.stdout + r.stderr)[-400:]
    # A renegotiation attempt (TLS 1.2, where renegotiation exists): `R` to s_client.
    proc = subprocess.Popen(["openssl", "s_client", "-connect", "%s:%d" % (HOST, port), "-tls1_2", "-CAfile", params["ca"]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    try:
        proc.stdin.write("R\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass
    try:
        text, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        text += "\n[s_client did not end]"
    out["reneg_output"] = text[-600:]
    out["reneg_ended"] = "[s_client did not end]" not in text
    out["after"] = still_chatting(pair, "after")
    print(json.dumps(out))

elif case == "proxy":
    ctx = context(params["ca"])

    class ProxiedTLS:
        """TLS over a socket whose first bytes are a PROXY header, sent in the
        same segment as the ClientHello (the daemon reads both at once)."""
        def __init__(self, header):
            self.sock = socket.create_connection((HOST, params["tls"]), timeout=10)
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.obj = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            self.sock.sendall(header + self.out.read())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    self.obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self.pump()
            self.flush()

        def flush(self):
            d = self.out.read()
            if d:
                self.sock.sendall(d)

        def pump(self):
            self.flush()
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("closed")
            self.inc.write(data)

        def sendall(self, data):
            self.obj.write(data)
            self.flush()

        def recv(self, n):
            while True:
                try:
                    return self.obj.read(n)
                except ssl.SSLWantReadError:
                    self.pump()
                except ssl.SSLZeroReturnError:
                    return b""

        def settimeout(self, t):
            self.sock.settimeout(t)

    watcher = ProxiedTLS(b"PROXY TCP4 10.9.9.9 127.0.0.1 4444 9889\r\n")
    rw = Reader()
    watcher.sendall(frame({"cmd": "nickname", "nickname": "watcher"}))
    recv_until(watcher, rw, lambda m: m.get("nickname") == "watcher")
    client = ProxiedTLS(b"PROXY TCP4 10.1.2.3 127.0.0.1 5555 9889\r\n")
    client.sendall(frame({"cmd": "nickname", "nickname": "proxied"}))
    got = recv_until(watcher, rw, lambda m: m.get("nickname") == "proxied")
    joins = [m for m in got if m.get("nickname") == "proxied"]
    print(json.dumps({"addr": joins[0].get("addr") if joins else None, "version": client.obj.version()}))

elif case == "reload":
    # N clients in rooms of 100; one message per room per round; every client
    # must get each round's message of its room. SIGHUP after round 2 with the
    # new certificate copied over the configured files.
    old_ctx, new_ctx = context(params["ca_old"]), context(params["ca_new"])
    n, port = params["n"], params["tls"]
    sel = selectors.DefaultSelector()
    clients = []
    for i in range(n):
        s = tls_client(port, old_ctx)
        s.setblocking(False)
        room = "r%d" % (i // 100)
        c = {"s": s, "r": Reader(), "room": room, "got": [], "closed": False}
        s.sendall(frame({"cmd": "nickname", "nickname": "u%d" % i, "room": room}))
        sel.register(s, selectors.EVENT_READ, c)
        clients.append(c)

    def pump(until, deadline):
        while time.monotonic() < deadline and not until():
            for key, _ in sel.select(timeout=0.2):
                c = key.data
                while True:
                    try:
                        data = c["s"].recv(65536)
                    except (ssl.SSLWantReadError, BlockingIOError):
                        break
                    except (ssl.SSLError, OSError):
                        data = b""
                    if not data:
                        c["closed"] = True
                        sel.unregister(c["s"])
                        break
                    c["got"].extend(m.get("content") for m in c["r"].feed(data) if m.get("cmd") == "msg")

    rooms = sorted(set(c["room"] for c in clients))
    leaders = {room: next(c for c in clients if c["room"] == room) for room in rooms}
    reloaded_at = None
    new_serial = None
    for rnd in range(6):
        if rnd == 3:
            for src, dst in [(params["new_cert"], params["cert"]), (params["new_key"], params["key"])]:
                # Mode 600, as an operator keeps a key: roomcastd refuses a key others can read.
                with open(src, "rb") as f, os.fdopen(os.open(dst + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as g:
                    g.write(f.read())
                os.rename(dst + ".tmp", dst)
            os.kill(params["pid"], signal.SIGHUP)
            reloaded_at = time.monotonic()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and new_serial is None:
                try:
                    s = tls_client(port, new_ctx, timeout=5)
                    new_serial = s.getpeercert()["serialNumber"]
                    s.close()
                except (ssl.SSLError, OSError):
                    pump(lambda: False, time.monotonic() + 0.1)
        text = "round%d" % rnd
        for room in rooms:
            leaders[room]["s"].setblocking(True)
            leaders[room]["s"].sendall(frame({"cmd": "msg", "content": text}))
            leaders[room]["s"].setblocking(False)
        pump(lambda: all(c["closed"] or text in c["got"] for c in clients), time.monotonic() + 30)
    old_still = None
    try:
        s = tls_client(port, old_ctx, timeout=5)
        old_still = True
        s.close()
    except ssl.SSLError:
        old_still = False
    missing = sum(1 for c in clients for r in range(6) if "round%d" % r not in c["got"] and c is not leaders[c["room"]])
    print(json.dumps({"clients": n, "closed": sum(c["closed"] for c in clients), "missing": missing,
                      "new_cert_seen": new_serial is not None, "old_ca_accepted_after": old_still}))
    for c in clients:
        c["s"].close()

elif case == "connect":
    try:
        ctx = context(params["ca"], params.get("cert"), params.get("key"))
        s = tls_client(params["tls"], ctx)
        serial = s.getpeercert()["serialNumber"]
        # TLS 1.3: a refused client certificate is only reported after the handshake.
        s.sendall(frame({"cmd": "nickname", "nickname": "probe"}))
        got = recv_until(s, Reader(), lambda m: m.get("nickname") == "probe", timeout=5)
        ok = any(m.get("nickname") == "probe" for m in got)
        print(json.dumps({"serial": serial, "joined": ok, "error": None if ok else str(got)}))
    except (ssl.SSLError, OSError) as e:
        print(json.dumps({"serial": None, "joined": False, "error": str(e)}))
else:
    sys.exit("unknown case " + case)
