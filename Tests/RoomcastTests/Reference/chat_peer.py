#!/usr/bin/env python3
"""Interop check: a roomcast client written only on Google's protobuf (Python)
chats with `roomcast chat` through roomcastd, in both directions.

  chat_peer.py --server 127.0.0.1:PORT --roomcast /path/to/roomcast

The Python side speaks docs/protocol/ by hand: LTB frames (u32 length, u16 type,
little-endian) and the proto2 bodies of §3, built with proto_ref.py's
descriptor_pb2 classes (no protoc). It joins room "interop", starts
`roomcast chat` in the same room with pipes for stdin/stdout, then:
  Python text and gift  -> roomcast prints them
  roomcast text and /gift typed on its stdin -> Python decodes them
  /quit -> Python sees roomcast's leave, roomcast exits 0.
Prints one JSON summary line; exit 0 on success, 1 with a reason on stderr.
"""
import argparse
import json
import os
import select
import socket
import struct
import subprocess
import sys
import time

from proto_ref import REAL  # Google protobuf classes for UserInfo, ChatMessage, GiftMessage

JOIN, LEAVE, TEXT, GIFT, HEARTBEAT = 0, 1, 2, 3, 8
ROOM = "interop"


class Peer:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.buffer = b""

    def send(self, kind, message):
        body = message.SerializeToString()
        self.sock.sendall(struct.pack("<IH", len(body), kind) + body)

    def frame(self, deadline):
        """The next frame as (type, body), or None at the deadline."""
        while True:
            if len(self.buffer) >= 6:
                length, kind = struct.unpack("<IH", self.buffer[:6])
                if len(self.buffer) >= 6 + length:
                    body = self.buffer[6:6 + length]
                    self.buffer = self.buffer[6 + length:]
                    return kind, body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return None
            if not data:
                raise RuntimeError("daemon closed the Python client's connection")
            self.buffer += data

    def expect(self, kind, cls, predicate, what, seconds=10):
        deadline = time.monotonic() + seconds
        while True:
            got = self.frame(deadline)
            if got is None:
                raise RuntimeError(f"Python never received {what}")
            if got[0] != kind:
                continue
            message = cls()
            message.ParseFromString(got[1])
            if not message.IsInitialized():
                raise RuntimeError(f"incomplete {cls.__name__} from roomcast: {got[1].hex()}")
            if predicate(message):
                return message


def user(name, level, icon, room):
    info = REAL["UserInfo"]()
    info.level, info.name, info.iconURL, info.room = level, name, icon, room
    return info


def read_line(process, pending, needle, seconds=10):
    """Reads roomcast's stdout until a line contains `needle`; returns that line."""
    deadline = time.monotonic() + seconds
    fd = process.stdout.fileno()
    while True:
        while b"\n" in pending[0]:
            line, pending[0] = pending[0].split(b"\n", 1)
            text = line.decode("utf-8")
            if needle in text:
                return text
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"roomcast never printed {needle!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"roomcast closed stdout before printing {needle!r}")
            pending[0] += data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--roomcast", required=True)
    args = parser.parse_args()
    host, port = args.server.rsplit(":", 1)

    peer = Peer(host, int(port))
    me = user("pybot", 7, "https://example.com/py.png", ROOM)
    peer.send(JOIN, me)
    peer.expect(JOIN, REAL["UserInfo"], lambda u: u.name == "pybot", "its own join")

    chat = subprocess.Popen([args.roomcast, "chat", "--server", args.server, "--name", "swifty",
                             "--room", ROOM, "--level", "3", "--icon", "https://example.com/swift.png"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pending = [b""]
    transcript = []
    try:
        joined = peer.expect(JOIN, REAL["UserInfo"], lambda u: u.name == "swifty", "roomcast's join")
        assert (joined.level, joined.iconURL, joined.room) == (3, "https://example.com/swift.png", ROOM), joined

        # Python -> roomcast
        text = REAL["ChatMessage"]()
        text.user.CopyFrom(me)
        text.text = "hello from Python ✓"
        peer.send(TEXT, text)
        transcript.append(read_line(chat, pending, "pybot: hello from Python ✓"))
        gift = REAL["GiftMessage"]()
        gift.user.CopyFrom(me)
        gift.giftname, gift.giftURL, gift.giftcount = "rose", "https://example.com/rose.png", 5
        peer.send(GIFT, gift)
        transcript.append(read_line(chat, pending, "pybot sent 5 x rose"))

        # roomcast -> Python
        chat.stdin.write("hello from Swift 🚀\n".encode())
        chat.stdin.flush()
        got = peer.expect(TEXT, REAL["ChatMessage"], lambda m: m.user.name == "swifty", "roomcast's text")
        assert got.text == "hello from Swift 🚀" and got.user.room == ROOM, got
        transcript.append(read_line(chat, pending, "swifty: hello from Swift"))  # its own echo
        chat.stdin.write(b"/gift crown https://example.com/crown.png 2\n")
        chat.stdin.flush()
        got_gift = peer.expect(GIFT, REAL["GiftMessage"], lambda m: m.user.name == "swifty", "roomcast's gift")
        assert (got_gift.giftname, got_gift.giftURL, got_gift.giftcount) == ("crown", "https://example.com/crown.png", 2)

        chat.stdin.write(b"/quit\n")
        chat.stdin.flush()
        peer.expect(LEAVE, REAL["UserInfo"], lambda u: u.name == "swifty", "roomcast's leave")
        status = chat.wait(timeout=10)
        if status != 0:
            raise RuntimeError(f"roomcast chat exited {status}: {chat.stderr.read().decode()}")
    except Exception:
        chat.kill()
        chat.wait()
        sys.stderr.write("roomcast stderr: " + chat.stderr.read().decode(errors="replace") + "\n")
        raise
    print(json.dumps({"ok": True, "roomcast_printed": transcript,
                      "python_received": [got.text, f"{got_gift.giftcount} x {got_gift.giftname}"]},
                     ensure_ascii=False))


if __name__ == "__main__":
    try:
        main()
    except Exception as error:
        sys.stderr.write(f"chat_peer.py: {error}\n")
        sys.exit(1)
