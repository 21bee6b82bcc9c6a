"""The systemd suite: TLS listeners (keys by LoadCredential=) and HAProxy with PROXY v2 in front.

Part of systemd/test-systemd.py (its docstring says what the suite changes and why)."""
import json
import os
import socket
import ssl
import struct
import subprocess
import time
from chatpool import field, user_info
from sdharness import (
    CREDENTIALS,
    Client,
    HAPROXY,
    HAPROXY_DIR,
    JOIN,
    TEXT,
    TLS_CONFIG,
    TLS_DIR,
    TLS_SOCKETS,
    UNIT,
    cursor,
    eventually,
    find,
    free_port,
    journal,
    messages,
    run,
    show,
    write_file,
)
from sd_service import write_config
from sd_listeners import enable_socket_on_free_port

class TLSClient(Client):
    """A Client inside TLS (Python's ssl, verifying against `ca`), optionally
    connecting from the loopback address `src`."""

    def __init__(self, port, ca, src=None):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.settimeout(5)
        if src:
            raw.bind((src, 0))
        raw.connect(("127.0.0.1", port))
        host, lport = raw.getsockname()
        self.addr = f"{host}:{lport}"
        self.sock = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname="localhost")
        self.buf = b""

    def send_json(self, obj):
        body = json.dumps(obj).encode()
        self.sock.sendall(struct.pack("<I", len(body)) + body)

    def recv_json(self, timeout=5):
        """The next JSON-dialect frame (u32 little-endian length + body) as a dict."""
        self._fill(4, timeout)
        n = struct.unpack("<I", self.buf[:4])[0]
        self._fill(4 + n, timeout)
        body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return json.loads(body)

    def recv_json_until(self, pred, timeout=5):
        deadline = time.monotonic() + timeout
        while True:
            m = self.recv_json(max(0.1, deadline - time.monotonic()))
            if pred(m):
                return m


def make_certificate(stage, directory):
    """A self-signed certificate for localhost and 127.0.0.1 and its key, made
    with openssl on the host into `directory` of the container (root, 0600, as
    an operator keeps them); returns the host path of the certificate."""
    d = os.path.join(stage, directory.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True, timeout=30)
    os.chmod(f"{d}/key.pem", 0o600)
    os.chmod(f"{d}/cert.pem", 0o600)
    return f"{d}/cert.pem"


def test_tls_sockets(t, stage):
    """TLS listeners under socket activation: three .socket units of the
    operator's (docs/operations/network.md, "TLS") named tls, json-tls and
    websocket-tls, the certificate and key given with LoadCredential= (root's
    0600 files on disk; the dynamic user reads systemd's copies, 0400, its own):
    each speaks its dialect inside TLS, in the rooms of the plain listener."""
    ca = make_certificate(stage, TLS_DIR)
    write_file("/etc/systemd/system/roomcastd.service.d/tls.conf",
               f"[Service]\nLoadCredential=cert.pem:{TLS_DIR}/cert.pem\nLoadCredential=key.pem:{TLS_DIR}/key.pem\n")
    ports = {}
    for unit, name, _ in TLS_SOCKETS:
        ports[name] = free_port()
        write_file(f"/etc/systemd/system/{unit}",
                   f"[Socket]\nListenStream=127.0.0.1:{ports[name]}\nFileDescriptorName={name}\nService={UNIT}\nAccept=no\n")
    write_config(stage, TLS_CONFIG)
    run("systemctl", "stop", UNIT)
    run("systemctl", "daemon-reload")
    mark = cursor()
    for unit, _, _ in TLS_SOCKETS:
        p = run("systemctl", "start", unit, check=False)
        t.check(f"systemctl start {unit}", p.returncode == 0, p.stderr.strip())
    clients = []
    try:
        ltb = TLSClient(ports["tls"], ca)   # the first client starts the service
        clients.append(ltb)
        t.check("a TLS client on the socket named tls starts the service (TLSv1.2+ handshake, certificate verified)",
                ltb.sock.version() in ("TLSv1.2", "TLSv1.3"), str(ltb.sock.version()))
        ltb.send(JOIN, user_info("tlsalice"))
        got = ltb.recv()
        t.check("it joins in LTB frames inside TLS (its own join back)", got[0] == JOIN and b"tlsalice" in got[1], repr(got)[:120])
        for _, _, protocol in TLS_SOCKETS:
            recs = eventually(lambda: find(journal(after=mark), f"({protocol})"))
            t.check(f"the daemon logged the {protocol} listener from systemd", bool(recs), str(messages(journal(after=mark)))[-400:])
        t.check("no TLS socket ignored (tls_not_configured)", not find(journal(after=mark), "ignoring descriptor"),
                str(messages(find(journal(after=mark), "ignoring descriptor"))))
        j = TLSClient(ports["json-tls"], ca)
        clients.append(j)
        j.send_json({"cmd": "nickname", "nickname": "tlsjo"})
        joined = j.recv_json_until(lambda m: m.get("cmd") == "join" and m.get("nickname") == "tlsjo")
        t.check("a JSON client on json-tls joins", joined.get("cmd") == "join", str(joined))
        ltb.send(TEXT, field(1, user_info("tlsalice")) + field(2, "hi over tls"))
        msg = j.recv_json_until(lambda m: m.get("cmd") == "msg")
        t.check("the LTB TLS client's text reaches the JSON TLS client", msg == {"cmd": "msg", "from": "tlsalice", "content": "hi over tls"}, str(msg))
        from websockets.sync.client import connect
        with connect(f"wss://localhost:{ports['websocket-tls']}/", subprotocols=["roomcast.json.v1"],
                     ssl=ssl.create_default_context(cafile=ca), open_timeout=5, ping_interval=None) as ws:
            ws.send(json.dumps({"cmd": "nickname", "nickname": "tlsweb"}))
            got = {}
            while got.get("cmd") != "join":
                got = json.loads(ws.recv(timeout=5))
            t.check("a wss:// client (Python websockets) on websocket-tls joins", got.get("nickname") == "tlsweb", str(got))
            j.send_json({"cmd": "msg", "content": "hi wss"})
            while got.get("cmd") != "msg":
                got = json.loads(ws.recv(timeout=5))
            t.check("the JSON TLS client's text reaches the wss:// client", got == {"cmd": "msg", "from": "tlsjo", "content": "hi wss"}, str(got))
        cred = run("sh", "-c", f"stat -c '%a %u' /proc/$(systemctl show -P MainPID {UNIT})/root{CREDENTIALS}/key.pem", check=False).stdout.strip()
        uid = run("sh", "-c", f"stat -c '%u' /proc/$(systemctl show -P MainPID {UNIT})", check=False).stdout.strip()
        print(f"        the key as the service sees it: mode and owner {cred!r}; the service's uid {uid}")
        t.check("the key_file check passes systemd's credential (mode 400, owned by the dynamic user)", cred == f"400 {uid}", f"{cred} vs uid {uid}")
    except (OSError, EOFError, ValueError, ssl.SSLError, TimeoutError) as e:
        t.check("TLS clients through the tls sockets", False, f"{type(e).__name__}: {e}")
    finally:
        for c in clients:
            c.close()
        for unit, _, _ in TLS_SOCKETS:
            run("systemctl", "stop", unit, check=False)
            run("rm", "-f", f"/etc/systemd/system/{unit}")
        run("systemctl", "stop", UNIT, check=False)
        run("rm", "-rf", "/etc/systemd/system/roomcastd.service.d/tls.conf", TLS_DIR)  # apt purge must leave no /etc/roomcast
        run("systemctl", "daemon-reload")
        write_config(stage, "")


def test_haproxy_restart(t, stage):
    """Debian's HAProxy on the host terminates TLS and sends PROXY v2 to the
    systemd-managed roomcastd (roomcastd-json.socket, [json] proxy_protocol):
    a systemctl restart keeps the proxied clients (HAProxy's connections to
    roomcastd are plain TCP in the fd store), and their addresses stay the
    clients' (JSON addr, the journal)."""
    if not os.access(HAPROXY, os.X_OK):
        t.check("haproxy is installed on the host (make deps)", False, HAPROXY)
        return
    ca = make_certificate(stage, HAPROXY_DIR)
    d = os.path.dirname(ca)
    with open(f"{d}/haproxy.pem", "w") as f:
        f.write(open(ca).read() + open(f"{d}/key.pem").read())
    # log level debug: the leave's journal line, which names the client, is a debug line.
    write_config(stage, "[json]\nproxy_protocol = yes\nproxy_from = 127.0.0.1\n[log]\nlevel = debug\n")
    jport = enable_socket_on_free_port(t, "roomcastd-json.socket")
    front = free_port()
    with open(f"{d}/haproxy.cfg", "w") as f:
        f.write(f"global\n    maxconn 100\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n"
                f"frontend chat\n    bind 127.0.0.1:{front} ssl crt {d}/haproxy.pem\n    default_backend roomcastd\n"
                f"backend roomcastd\n    server r1 127.0.0.1:{jport} send-proxy-v2\n")
    haproxy = subprocess.Popen([HAPROXY, "-db", "-f", f"{d}/haproxy.cfg"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    clients = []
    try:
        def listening():
            try:
                socket.create_connection(("127.0.0.1", front), timeout=1).close()
                return True
            except OSError:
                return False
        t.check("haproxy listens (TLS frontend, send-proxy-v2 backend)", eventually(listening, timeout=10), "no listener")
        a = TLSClient(front, ca, src="127.0.0.2")
        b = TLSClient(front, ca, src="127.0.0.3")
        clients += [a, b]
        a.send_json({"cmd": "nickname", "nickname": "proxa"})
        ja = a.recv_json_until(lambda m: m.get("cmd") == "join" and m.get("nickname") == "proxa", timeout=10)
        t.check("a client through HAProxy joins; JSON addr is its own address, not HAProxy's", ja.get("addr") == a.addr, f"{ja} vs {a.addr}")
        b.send_json({"cmd": "nickname", "nickname": "proxb"})
        jb = a.recv_json_until(lambda m: m.get("cmd") == "join" and m.get("nickname") == "proxb")
        t.check("the room sees the second client's join with its address", jb.get("addr") == b.addr, f"{jb} vs {b.addr}")
        before = show(UNIT, "MainPID")["MainPID"]
        mark = cursor()
        p = run("systemctl", "restart", UNIT, check=False)
        t.check("systemctl restart roomcastd with two proxied clients", p.returncode == 0, p.stderr.strip())
        after = show(UNIT, "MainPID")["MainPID"]
        t.check(f"a new process serves (PID {before} -> {after})", after not in (before, "0"))
        restored = eventually(lambda: find(journal(after=mark), "restored "))
        t.check("the new process restored the proxied connections", bool(restored), str(messages(journal(after=mark)))[-400:])
        for r in restored:
            print(f"        | {r.get('MESSAGE')}")
        a.send_json({"cmd": "msg", "content": "after the restart"})
        mb = b.recv_json_until(lambda m: m.get("cmd") == "msg", timeout=10)
        t.check("the proxied clients chat across the restart (no reconnect: the same TLS sessions with HAProxy)",
                mb == {"cmd": "msg", "from": "proxa", "content": "after the restart"}, str(mb))
        a.close()
        clients.remove(a)
        left = b.recv_json_until(lambda m: m.get("cmd") == "leave", timeout=10)
        t.check("after the restart the leave carries the client's own address (kept in the hand-over)",
                left == {"cmd": "leave", "nickname": "proxa", "addr": a.addr}, f"{left} vs {a.addr}")
        t.check("the journal of the new process names the client's address",
                bool(eventually(lambda: [r for r in journal(after=mark) if r.get("CLIENT_ADDR") == a.addr])),
                str([(r.get("MESSAGE"), r.get("CLIENT_ADDR")) for r in journal(after=mark)][-6:]))
        t.check("the proxy is never a client", not any((r.get("CLIENT_ADDR") or "").startswith("127.0.0.1:") for r in journal(after=mark)))
    except (OSError, EOFError, ValueError, ssl.SSLError) as e:
        t.check("proxied clients across the restart", False, f"{type(e).__name__}: {e}")
    finally:
        for c in clients:
            c.close()
        haproxy.terminate()
        try:
            haproxy.wait(5)
        except subprocess.TimeoutExpired:
            haproxy.kill()
            haproxy.wait(5)
        run("systemctl", "disable", "--now", "roomcastd-json.socket", check=False)
        run("systemctl", "stop", UNIT, check=False)
        run("rm", "-rf", HAPROXY_DIR)  # apt purge must leave no /etc/roomcast
        write_config(stage, "")
