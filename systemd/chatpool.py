"""A pool of chatting LTB clients in one thread, for the restart tests of
restarts that keep the clients (systemd/test-systemd.py) and the restart bench
(bench/restart.py).

Every client joins room `i % rooms` and then sends text frames at `rate`
per second. A frame's content is fixed-width ASCII,
"SSSSSS:QQQQQQQQ:TTTTTTTTTTTTTTTTTTTT" (sender, its sequence number, the
send time in ns on CLOCK_MONOTONIC), so every receiver checks, per sender,
that frames arrive once and in order, and measures the relay latency. The
daemon echoes to the sender too (`echo = yes`, the default), so each frame
is expected by every member of its room.

What it counts: connections closed by the daemon (EOF) or reset (RST),
frames missing, duplicated or out of order per (receiver, sender), and each
delivery's latency by send time, so that a window around an event (a
restart) gives the gap: p99 and max relay latency of the frames sent in it.
"""
import array
import os
import selectors
import socket
import struct
import time

JOIN, LEAVE, TEXT, HEARTBEAT = 0, 1, 2, 8
CONTENT = 36    # len("SSSSSS:QQQQQQQQ:TTTTTTTTTTTTTTTTTTTT")


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def fields(body):
    """The proto2 fields of `body` as {number: value} (the last occurrence wins): ints for varints,
    bytes for length-delimited fields; enough for UserInfo, ChatMessage, GiftMessage and Notice."""
    out, i = {}, 0
    while i < len(body):
        key, i = read_varint(body, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out[number], i = read_varint(body, i)
        elif wire == 2:
            n, i = read_varint(body, i)
            out[number], i = bytes(body[i:i + n]), i + n
        else:
            raise ValueError(f"wire type {wire}")
    return out


def read_varint(b, i):
    """The varint at b[i:], and the index after it."""
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def user_info(name, room=None):
    body = field(1, 1) + field(2, name) + field(3, "https://example.com/" + name + ".png")
    return body + (field(4, room) if room else b"")


def frame(type_, body=b""):
    return struct.pack("<IH", len(body), type_) + body


def now_ns():
    return time.monotonic_ns()


class Member:
    __slots__ = ("i", "sock", "inbuf", "outbuf", "seq", "closed", "identity", "room", "held")

    def __init__(self, i, sock, room):
        self.i = i
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.seq = 0
        self.closed = None      # "eof" or "rst" once the daemon closed it
        self.room = room
        self.identity = user_info(f"u{i:06d}", f"room{room}")
        self.held = None        # the rest of a frame split across an event


class ChatPool:
    def __init__(self, port, clients=1000, rooms=10, rate=0.2, host="127.0.0.1"):
        """`port`: one port, or a list of ports of daemons sharing their rooms
        (a cluster): client i connects to port[(i // rooms) % len(port)], so
        that every room has members on each of them."""
        self.ports = list(port) if isinstance(port, (list, tuple)) else [port]
        self.port, self.host = self.ports[0], host
        self.n, self.rooms, self.rate = clients, rooms, rate
        self.sel = selectors.DefaultSelector()
        self.members = []
        self.chatting = False
        self.sent = [0] * clients             # chat frames sent per sender
        self.last = {}                        # (receiver, sender) -> last seq received
        self.received = {}                    # (receiver, sender) -> frames received
        self.duplicates = 0                   # a seq at or below the last one: duplicated or reordered
        self.skipped = 0                      # seqs jumped over (lost, unless they arrive later: reordered)
        self.foreign = 0                      # a frame from a sender of another room
        self.t_send = array.array("d")        # per delivery: send time (s, monotonic)
        self.latency = array.array("d")       # per delivery: latency (s)
        self.other_frames = 0                 # joins, leaves (not counted as chat)
        self.leaves = []                      # (receiver, time received (s, monotonic), body) of every leave frame
        self.joins = []                       # (receiver, body) of every join frame
        self.sent_at = {}                     # (sender, seq) -> send time (s, monotonic)
        self.copies = {}                      # (sender, seq) -> receivers that got it
        self.split_frames = set()             # (sender, seq) sent in two halves: their latency is the client's, not counted
        self.split_received = 0
        self.next_send = 0.0
        self.turn = 0

    # ------------------------------------------------------------- set-up

    def daemon(self, i):
        """The index in `port` of the daemon client i talks to."""
        return (i // self.rooms) % len(self.ports)

    def connect(self, batch=200):
        """Connects every client, `batch` at a time (the daemon accepts 64 per wakeup)."""
        for start in range(0, self.n, batch):
            pending = []
            for i in range(start, min(start + batch, self.n)):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
                s.connect_ex((self.host, self.ports[self.daemon(i)]))
                pending.append((i, s))
            deadline = time.monotonic() + 10
            waiting = {s.fileno(): (i, s) for i, s in pending}
            poller = selectors.DefaultSelector()
            for i, s in pending:
                poller.register(s, selectors.EVENT_WRITE)
            while waiting and time.monotonic() < deadline:
                for key, _ in poller.select(0.5):
                    i, s = waiting.pop(key.fd)
                    poller.unregister(s)
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, f"client {i}: connect: {os.strerror(err)}")
            poller.close()
            if waiting:
                raise TimeoutError(f"{len(waiting)} connects did not complete in 10 s")
            for i, s in pending:
                m = Member(i, s, i % self.rooms)
                self.members.append(m)
                self.sel.register(s, selectors.EVENT_READ, m)

    def join(self, settle=1.0, timeout=30):
        """Every client joins its room; returns once nothing arrived for `settle` s."""
        for m in self.members:
            self._send(m, frame(JOIN, m.identity))
        self._quiet(settle, timeout)

    def _quiet(self, settle, timeout):
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            got = self._poll(0.05)
            now = time.monotonic()
            if got:
                quiet_since = now
            elif now - quiet_since >= settle:
                return
        raise TimeoutError("the room traffic did not settle")

    # ------------------------------------------------------------- traffic

    def start_chat(self):
        self.chatting = True
        self.next_send = time.monotonic()

    def run(self, seconds):
        """Chats (if started) and reads for `seconds`."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                return
            if self.chatting:
                self._send_due(now)
                wait = max(0.0, min(self.next_send - time.monotonic(), end - now, 0.02))
            else:
                wait = min(end - now, 0.05)
            self._poll(wait)

    def drain(self, settle=1.0, timeout=30):
        """Stops sending and reads until nothing arrives for `settle` s."""
        self.chatting = False
        self._quiet(settle, timeout)

    def _send_due(self, now):
        interval = 1.0 / (self.rate * self.n)
        while self.next_send <= now:
            m = self.members[self.turn % self.n]
            self.turn += 1
            self.next_send += interval
            if m.closed or m.held is not None:
                continue
            self._send(m, self._chat_frame(m))

    def _chat_frame(self, m):
        t = now_ns()
        content = f"{m.i:06d}:{m.seq:08d}:{t:020d}"
        self.sent_at[(m.i, m.seq)] = t / 1e9
        m.seq += 1
        self.sent[m.i] += 1
        return frame(TEXT, field(1, m.identity) + field(2, content))

    def split_next(self, members):
        """Each of `members` sends the first half of its next chat frame and
        holds the rest (a partial frame in the daemon across an event)."""
        for m in members:
            self.split_frames.add((m.i, m.seq))
            f = self._chat_frame(m)
            cut = 6 + (len(f) - 6) // 2
            self._send(m, f[:cut])
            m.held = f[cut:]

    def complete_split(self):
        for m in self.members:
            if m.held is not None:
                self._send(m, m.held)
                m.held = None

    def _send(self, m, data):
        if m.closed:
            return
        if m.outbuf:
            m.outbuf += data
            return
        try:
            n = m.sock.send(data)
        except BlockingIOError:
            n = 0
        except (ConnectionResetError, BrokenPipeError):
            self._closed(m, "rst")
            return
        if n < len(data):
            m.outbuf += data[n:]
            self.sel.modify(m.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, m)

    def _poll(self, timeout):
        got = False
        for key, events in self.sel.select(timeout):
            m = key.data
            if events & selectors.EVENT_WRITE and m.outbuf:
                try:
                    n = m.sock.send(m.outbuf)
                    del m.outbuf[:n]
                except BlockingIOError:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    self._closed(m, "rst")
                    continue
                if not m.outbuf:
                    self.sel.modify(m.sock, selectors.EVENT_READ, m)
            if events & selectors.EVENT_READ:
                try:
                    data = m.sock.recv(262144)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    self._closed(m, "rst")
                    continue
                if not data:
                    self._closed(m, "eof")
                    continue
                got = True
                m.inbuf += data
                self._parse(m)
        return got

    def _closed(self, m, how):
        m.closed = how
        try:
            self.sel.unregister(m.sock)
        except (KeyError, ValueError):
            pass
        m.sock.close()

    def _parse(self, m):
        buf = m.inbuf
        off = 0
        now = now_ns()
        r = m.i
        while len(buf) - off >= 6:
            length, type_ = struct.unpack_from("<IH", buf, off)
            end = off + 6 + length
            if end > len(buf):
                break
            if type_ == TEXT and length >= CONTENT and buf[end - CONTENT + 6] == 58:  # ':'
                c = bytes(buf[end - CONTENT:end])
                s, q, t = int(c[0:6]), int(c[7:15]), int(c[16:36])
                if s >= self.n or self.members[s].room != m.room:
                    self.foreign += 1
                else:
                    key = r * self.n + s
                    prev = self.last.get(key, -1)
                    if q <= prev:
                        self.duplicates += 1
                    else:
                        if q > prev + 1:
                            self.skipped += q - prev - 1
                        self.last[key] = q
                    self.received[key] = self.received.get(key, 0) + 1
                    self.copies[(s, q)] = self.copies.get((s, q), 0) + 1
                    if (s, q) not in self.split_frames:
                        self.t_send.append(t / 1e9)
                        self.latency.append((now - t) / 1e9)
                    else:
                        self.split_received += 1
            else:
                self.other_frames += 1
                if type_ == LEAVE:
                    self.leaves.append((r, now / 1e9, bytes(buf[off + 6:end])))
                elif type_ == JOIN:
                    self.joins.append((r, bytes(buf[off + 6:end])))
            off = end
        del buf[:off]

    # ------------------------------------------------------------- results

    def closed(self):
        """(EOF count, RST count)."""
        eof = sum(1 for m in self.members if m.closed == "eof")
        rst = sum(1 for m in self.members if m.closed == "rst")
        return eof, rst

    def lost(self):
        """Chat frames expected and not received, over every (receiver, sender) of a room."""
        missing = 0
        for r in self.members:
            for s in range(r.room, self.n, self.rooms):
                missing += self.sent[s] - self.received.get(r.i * self.n + s, 0)
        return missing

    def missing(self):
        """[(send time, sender, seq, copies missing)] of every chat frame some member of its room did not get."""
        size = lambda s: len(range(s % self.rooms, self.n, self.rooms))
        return sorted((t, s, q, size(s) - self.copies.get((s, q), 0))
                      for (s, q), t in self.sent_at.items() if self.copies.get((s, q), 0) < size(s))

    def lost_between(self):
        """{(sender's daemon, receiver's daemon): chat frames not received}, as lost() counts them."""
        out = {}
        for r in self.members:
            for s in range(r.room, self.n, self.rooms):
                key = (self.daemon(s), self.daemon(r.i))
                out[key] = out.get(key, 0) + self.sent[s] - self.received.get(r.i * self.n + s, 0)
        return out

    def expected(self):
        return sum(self.sent[s] * len(range(s % self.rooms, self.n, self.rooms)) for s in range(self.n))

    def deliveries(self):
        """Chat frames received, split ones included."""
        return len(self.latency) + self.split_received

    def window(self, t0, t1):
        """p50, p99 and max relay latency (ms) of the frames sent in [t0, t1] (monotonic s), and their count."""
        lat = sorted(l for t, l in zip(self.t_send, self.latency) if t0 <= t <= t1)
        if not lat:
            return (0.0, 0.0, 0.0, 0)
        pick = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
        return (pick(0.5), pick(0.99), lat[-1] * 1000, len(lat))

    def close(self):
        for m in self.members:
            if not m.closed:
                self.sel.unregister(m.sock)
                m.sock.close()
        self.sel.close()


def pid_cpu_seconds(pid):
    """utime + stime of a process, in seconds (proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
