"""The browser test's peers beside the page: an LTB client in the same room and PhoneLink,
a loopback link the test can reset and hold (a phone's network). Part of test_browser.py."""
import json
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "systemd"))
from chatpool import field, fields  # noqa: E402 (the proto2 helpers the systemd suite uses)


JOIN, LEAVE, TEXT, GIFT = 0, 1, 2, 3
ROOM = "stage"
DEADLINE_S = 20


def fail(message):
    print("test-browser: FAILED: " + message, file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------ LTB (docs/protocol/ltb.md sections 1-3)

def user_info(name, room=ROOM):
    return field(1, 0) + field(2, name.encode()) + field(3, b"") + field(4, room.encode())


def frame(kind, body):
    return struct.pack("<IH", len(body), kind) + body


class LTBClient:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
        self.buffer = b""

    def send(self, kind, body):
        self.sock.sendall(frame(kind, body))

    def next_frame(self):
        while True:
            if len(self.buffer) >= 6:
                length, kind = struct.unpack("<IH", self.buffer[:6])
                if len(self.buffer) >= 6 + length:
                    body = self.buffer[6:6 + length]
                    self.buffer = self.buffer[6 + length:]
                    return kind, body
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("roomcastd closed the LTB connection")
            self.buffer += chunk

    def texts(self, done, keep):
        """{sender: [text]} of the text frames whose text `keep` accepts, in order of
        arrival, read until `done` of that is true, within the deadline."""
        got = {}
        end = time.monotonic() + DEADLINE_S
        while not done(got):
            if time.monotonic() > end:
                fail("the LTB client did not get all the texts in %d s; it got %r" % (DEADLINE_S, got))
            try:
                k, body = self.next_frame()
            except OSError as e:
                fail("the LTB client, reading texts: %s; it got %r" % (e, got))
            if k == TEXT:
                f = fields(body)
                who, said = fields(f.get(1, b"")).get(2, b"").decode(), f.get(2, b"").decode()
                if keep(said):
                    got.setdefault(who, []).append(said)
        return got

    def expect(self, kind, name, text=None):
        """Skips frames until one of `kind` from `name` (and `text`) arrives, within the deadline."""
        seen = []
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            try:
                k, body = self.next_frame()
            except OSError as e:
                fail("the LTB client, waiting for %s from %s (%r): %s; it got %r" % (kind, name, text, e, seen))
            if k not in (JOIN, LEAVE, TEXT, GIFT):
                seen.append((k, body.hex()))
                continue
            f = fields(body)
            if k in (JOIN, LEAVE):
                who, said = f.get(2, b"").decode(), None
            else:
                who, said = fields(f.get(1, b"")).get(2, b"").decode(), f.get(2, b"").decode()
            seen.append((k, who, said))
            if k == kind and who == name and (text is None or said == text):
                return
        fail("the LTB client did not get %s from %s (%r); it got %r" % (kind, name, text, seen))


# ------------------------------------------------------------ a phone's network (issue 23)

class PhoneLink:
    """A loopback TCP proxy between the browser and the WebSocket listener, standing in
    for a phone's network: cut() resets every connection through it (both sides, as a
    tunnel or a Wi-Fi-to-carrier switch does), hold() leaves new connections waiting in
    the listen backlog until release(). It reads the WebSocket frames both ways (RFC 6455
    section 5.2) to record each side's JSON messages, to cut right after a chosen frame
    to the browser (cut_after), and to insert a message to the browser between two frames
    (inject)."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.accepting = threading.Event()
        self.accepting.set()
        self.stopping = False
        self.links = []          # [(browser socket, daemon socket, lock of the browser side)]
        self.websockets = []     # the link numbers that were upgraded, in order
        self.record = []         # [(link number, "sent" | "received", JSON object)], as the browser sees it
        self.cut_after = None    # a predicate on a message to the browser: forward it, then cut
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping:
            if not self.accepting.wait(0.05):
                continue
            try:
                browser_side, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            daemon_side = socket.create_connection(("127.0.0.1", self.upstream))
            send_lock = threading.Lock()
            with self.lock:
                number = len(self.links)
                self.links.append((browser_side, daemon_side, send_lock))
            threading.Thread(target=self._pump, args=(number, browser_side, daemon_side, None, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(number, daemon_side, browser_side, send_lock, "received"),
                             daemon=True).start()

    def _pump(self, number, src, dst, dst_lock, direction):
        """Forwards src to dst: the HTTP head as it comes, then (after a 101 answer) whole frames."""
        buffer, head, upgraded = b"", True, False
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                if head:
                    end = buffer.find(b"\r\n\r\n")
                    if end < 0:
                        continue
                    head = False
                    first = buffer[:buffer.find(b"\r\n")]
                    upgraded = b" 101 " in first if direction == "received" else b"upgrade: websocket" in buffer[:end].lower()
                    if upgraded and direction == "received":
                        with self.lock:
                            self.websockets.append(number)
                    self._send(dst, dst_lock, buffer[:end + 4])
                    buffer = buffer[end + 4:]
                if not upgraded:
                    self._send(dst, dst_lock, buffer)
                    buffer = b""
                    continue
                while True:
                    whole = self._frame(buffer)
                    if whole is None:
                        break
                    size, opcode, payload = whole
                    self._send(dst, dst_lock, buffer[:size])
                    buffer = buffer[size:]
                    if opcode == 1:
                        message = json.loads(payload)
                        with self.lock:
                            self.record.append((number, direction, message))
                            cut = direction == "received" and self.cut_after is not None and self.cut_after(message)
                            if cut:
                                self.cut_after = None
                        if cut:
                            self._reset(number)
                            return
        except OSError:
            pass
        self._reset(number)

    @staticmethod
    def _frame(b):
        """(size, opcode, unmasked payload) of the whole frame at the start of b, or None."""
        if len(b) < 2:
            return None
        n, i = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, i = struct.unpack(">H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, i = struct.unpack(">Q", b[2:10])[0], 10
        mask = b""
        if b[1] & 0x80:
            mask, i = b[i:i + 4], i + 4
        if len(b) < i + n:
            return None
        payload = b[i:i + n]
        if mask:
            payload = bytes(c ^ mask[k % 4] for k, c in enumerate(payload))
        return i + n, b[0] & 0x0F, payload

    @staticmethod
    def _send(dst, lock, data):
        if lock is None:
            dst.sendall(data)
        else:
            with lock:
                dst.sendall(data)

    def _reset(self, number):
        for s in self.links[number][:2]:
            try:
                # A reset (linger 0); shutdown first wakes the other pump's recv.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def cut(self):
        """Resets every connection: the browser sees its WebSocket close without a close frame (1006)."""
        with self.lock:
            numbers = range(len(self.links))
        for n in numbers:
            self._reset(n)

    def hold(self):
        self.accepting.clear()

    def release(self):
        self.accepting.set()

    def inject(self, message):
        """Sends the browser, on the newest WebSocket, a text message of the server (unmasked)."""
        payload = json.dumps(message, separators=(",", ":")).encode()
        assert len(payload) < 126
        with self.lock:
            browser_side, _, send_lock = self.links[self.websockets[-1]]
        self._send(browser_side, send_lock, bytes([0x81, len(payload)]) + payload)

    def messages(self, direction):
        """[(link number, JSON object)] the browser sent or received, in order."""
        with self.lock:
            return [(n, m) for n, d, m in self.record if d == direction]

    def close(self):
        self.stopping = True
        self.cut()
        self.listener.close()


# ------------------------------------------------------------ the daemon
