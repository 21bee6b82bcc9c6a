#!/usr/bin/env python3
"""Correctness check of the C relay (bench/ltb-relay.c), run by `make bench`
before it measures anything: a yardstick that loses, reorders or invents
frames would make every ratio meaningless.

    check-relay.py PATH/TO/ltb-relay

Checks, on 127.0.0.1 (a few seconds, every wait bounded):
- a frame written one byte at a time reaches the others whole, and not its sender;
- heartbeats (type 8) are never relayed; joins (type 0) are;
- 2,000 frames of 0 to 20,000 bytes, written in random chunks, reach every
  other client byte for byte and in order;
- a client that does not read for a while gets everything, in order, once it
  reads (the backlog path), and the others are not held up meanwhile;
- a frame longer than 64 KiB closes its sender;
- with --echo the sender gets its own frames too;
- SIGTERM stops the relay with status 0.
Standard library only. Prints "N passed, 0 failed" or exits 1.
"""
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time

RELAY = sys.argv[1] if len(sys.argv) > 1 else ".build-bench/ltb-relay"
TIMEOUT = 10.0


def frame(type_, body):
    return struct.pack("<IH", len(body), type_) + body


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    def __init__(self, *args):
        self.port = free_port()
        self.proc = subprocess.Popen([RELAY, *args, str(self.port)], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("relay not listening")

    def client(self):
        c = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def read_frames(sock, count):
    """Reads exactly `count` frames (bounded by the socket timeout)."""
    out, buf = [], b""
    while len(out) < count:
        while len(buf) >= 6:
            length, type_ = struct.unpack_from("<IH", buf)
            if len(buf) < 6 + length:
                break
            out.append((type_, buf[6:6 + length]))
            buf = buf[6 + length:]
            if len(out) == count:
                break
        if len(out) == count:
            break
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise AssertionError(f"end of stream after {len(out)} of {count} frames")
        buf += chunk
    assert not buf, f"{len(buf)} bytes beyond the expected frames"
    return out


def nothing_more(sock, wait=0.3):
    sock.settimeout(wait)
    try:
        data = sock.recv(1 << 16)
        return data == b""  # EOF also counts as nothing more
    except socket.timeout:
        return True
    finally:
        sock.settimeout(TIMEOUT)


def settle(relay, *clients):
    """Waits until the relay has accepted every client: a marker frame from
    the first one must reach all the others."""
    a, rest = clients[0], clients[1:]
    a.sendall(frame(100, b"settle"))
    for c in rest:
        assert read_frames(c, 1) == [(100, b"settle")]


def test_split_frame_and_no_echo():
    r = Relay()
    try:
        a, b, c = r.client(), r.client(), r.client()
        settle(r, a, b, c)
        data = frame(2, b"hello, room")
        for i in range(len(data)):
            a.send(data[i:i + 1])
            time.sleep(0.002)
        assert read_frames(b, 1) == [(2, b"hello, room")]
        assert read_frames(c, 1) == [(2, b"hello, room")]
        assert nothing_more(a), "the sender got its own frame back (echo is off)"
    finally:
        assert r.stop() == 0


def test_heartbeats_dropped_joins_relayed():
    r = Relay()
    try:
        a, b = r.client(), r.client()
        settle(r, a, b)
        a.sendall(frame(8, b"this is a heartBeat message ") + frame(0, b"join") + frame(8, b"") + frame(3, b"gift"))
        assert read_frames(b, 2) == [(0, b"join"), (3, b"gift")]
        assert nothing_more(b)
    finally:
        assert r.stop() == 0


def test_many_frames_in_order():
    r = Relay()
    try:
        a, b, c = r.client(), r.client(), r.client()
        settle(r, a, b, c)
        rng = random.Random(12)
        frames = [(rng.choice([0, 2, 3, 100, 65535]), os.urandom(rng.choice([0, 1, 5, 64, 1000, 16384, 20000])))
                  for _ in range(2000)]
        stream = b"".join(frame(t, body) for t, body in frames)
        got = {}
        # The readers run beside the writer: 20 MB does not fit in socket buffers.
        import threading
        def reader(name, s):
            got[name] = read_frames(s, len(frames))
        threads = [threading.Thread(target=reader, args=(n, s)) for n, s in (("b", b), ("c", c))]
        for t in threads:
            t.start()
        i = 0
        while i < len(stream):
            n = rng.randint(1, 70_000)
            a.sendall(stream[i:i + n])
            i += n
        for t in threads:
            t.join(TIMEOUT * 3)
        assert got.get("b") == frames, "b: frames lost, changed or out of order"
        assert got.get("c") == frames, "c: frames lost, changed or out of order"
        assert nothing_more(a)
    finally:
        assert r.stop() == 0


def test_slow_reader_gets_everything_later():
    r = Relay()
    try:
        a, fast, slow = r.client(), r.client(), r.client()
        settle(r, a, fast, slow)
        # 6.5 MB: far more than the relay's 128 KiB send buffer and the
        # reader's receive buffer hold, so most of it waits in the backlog.
        frames = [(100, struct.pack("<I", i) + b"x" * 16380) for i in range(400)]
        for t, body in frames:
            a.sendall(frame(t, body))
            assert read_frames(fast, 1) == [(t, body)], "the fast reader was held up"
        assert read_frames(slow, len(frames)) == frames, "the slow reader lost frames or order"
    finally:
        assert r.stop() == 0


def test_oversized_frame_closes_sender():
    r = Relay()
    try:
        a, b = r.client(), r.client()
        settle(r, a, b)
        a.sendall(struct.pack("<IH", 64 * 1024 + 1, 100))
        a.settimeout(TIMEOUT)
        assert a.recv(1) == b"", "the sender of an oversized frame was not closed"
        assert nothing_more(b)
    finally:
        assert r.stop() == 0


def test_echo_option():
    r = Relay("--echo")
    try:
        a, b = r.client(), r.client()
        a.sendall(frame(100, b"one"))
        assert read_frames(a, 1) == [(100, b"one")]
        assert read_frames(b, 1) == [(100, b"one")]
    finally:
        assert r.stop() == 0


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    failed = 0
    for t in tests:
        try:
            t()
            print(f"ok   {t.__name__}")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit 1
            failed += 1
            print(f"FAIL {t.__name__}: {type(e).__name__}: {e}")
    print(f"check-relay: {len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
