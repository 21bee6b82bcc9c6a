# Loop stall while one connection pipelines N keyless requests: the worst
# round trip of a second connection's GET /healthz meanwhile, in ms.
import socket, sys, threading, time
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
port = 19899
req = b"GET /v1/stats HTTP/1.1\r\nHost: a\r\n\r\n"
a = socket.create_connection(("127.0.0.1", port)); b = socket.create_connection(("127.0.0.1", port))
b.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
done = threading.Event(); got = [0]
def reader():
    buf = b""
    while got[0] < N:
        c = a.recv(1 << 20)
        if not c: break
        got[0] += c.count(b"HTTP/1.1 ")
    done.set()
threading.Thread(target=reader, daemon=True).start()
threading.Thread(target=lambda: a.sendall(req * N), daemon=True).start()
probe = b"GET /healthz HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k-0123456789abcdef\r\n\r\n"
worst = 0.0; rtts = []
t0 = time.monotonic()
while not done.is_set():
    s = time.monotonic(); b.sendall(probe); d = b""
    while b"\r\n\r\n" not in d or not d.endswith(b"\n"): d += b.recv(4096)
    r = (time.monotonic() - s) * 1000; rtts.append(r); worst = max(worst, r)
    time.sleep(0.001)
print(f"N={N} answers={got[0]} total={1000*(time.monotonic()-t0):.0f} ms probes={len(rtts)} worst_probe_rtt={worst:.1f} ms")
