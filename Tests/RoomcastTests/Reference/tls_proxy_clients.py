#!/usr/bin/env python3
"""TLS clients for the HAProxy test (HAProxyIntegrationTests.swift): connects each
client of the JSON list in argv[1] ({"src", "port", "send" (hex)}) from its own
loopback source address through TLS (CA file argv[2], name "localhost"), one
after another, sends its bytes, then reads from all of them for argv[3]
seconds. Prints one JSON line per client: src, its local address, the hex of
what it received, and whether the far end closed it. Bounded in time."""
import json, select, socket, ssl, sys, time

clients = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=sys.argv[2])
hold = float(sys.argv[3])
conns = []
for c in clients:
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(5)
    raw.bind((c["src"], 0))
    raw.connect(("127.0.0.1", c["port"]))
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    s.sendall(bytes.fromhex(c["send"]))
    conns.append({"src": c["src"], "sock": s, "local": "%s:%d" % s.getsockname(), "got": b"", "closed": False})
    time.sleep(0.3)
deadline = time.monotonic() + hold
while time.monotonic() < deadline:
    live = [c for c in conns if not c["closed"]]
    if not live:
        break
    ready, _, _ = select.select([c["sock"] for c in live], [], [], max(0.0, deadline - time.monotonic()))
    for c in live:
        if c["sock"] in ready or c["sock"].pending():
            try:
                data = c["sock"].recv(65536)
            except (ssl.SSLError, OSError):
                data = b""
            if data:
                c["got"] += data
            else:
                c["closed"] = True
for c in conns:
    print(json.dumps({"src": c["src"], "local": c["local"], "got": c["got"].hex(), "closed": c["closed"]}))
    c["sock"].close()
