#!/usr/bin/env python3
"""A client whose network vanishes (no FIN, no RST) while its room keeps
talking: how long until roomcastd announces its leave?

  unshare -n python3 dead_peer.py --roomcastd PATH --dialect json|ltb --wait SECONDS

Runs in a network namespace of its own (unshare -n, as root): it brings up
that namespace's loopback, starts roomcastd there, and connects an observer
(LTB, 127.0.0.1) and a victim (from 127.0.0.2) to the default room. Then a
routing rule blackholes everything sent to 127.0.0.2: the daemon's frames
to the victim are never acknowledged, as when a phone loses its network.
The observer sends a text every 500 ms (so the daemon always has
unacknowledged data for the victim: TCP keepalive alone never probes then)
and waits for the victim's leave.

- json: the victim is a JSON client (sends no heartbeats); [json]
  tcp_keepalive = 3s. The leave should come within about 3 s.
- ltb: the victim keeps sending heartbeats, but they are lost too (packets
  from 127.0.0.2 now fail the kernel's reverse-path check); [heartbeat]
  timeout = 3s. The leave should come within about 3 s.

Prints one JSON line: {"dialect": ..., "leave_after_s": seconds or null}.
"""
import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from chat_peer import Peer  # LTB frames from a socket, with a deadline
from proto_ref import REAL

JOIN, LEAVE, TEXT, HEARTBEAT = 0, 1, 2, 8


def sh(command):
    subprocess.run(command, shell=True, check=True)


def frame(kind, body):
    return struct.pack("<IH", len(body), kind) + body


def user(name):
    u = REAL["UserInfo"]()
    u.level, u.name, u.iconURL = 1, name, ""
    return u


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--roomcastd", required=True)
    parser.add_argument("--dialect", choices=["json", "ltb"], required=True)
    parser.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args()

    sh("ip link set lo up")
    directory = tempfile.mkdtemp(prefix="roomcast-dead-peer-")
    config = os.path.join(directory, "roomcastd.conf")
    with open(config, "w") as f:
        f.write("[server]\nlisten = 127.0.0.1:0\n[heartbeat]\ntimeout = 3s\n[log]\nlevel = debug\n"
                "[json]\nlisten = 127.0.0.1:0\ntcp_keepalive = 3s\n")
    log = open(os.path.join(directory, "stderr"), "w+")
    daemon = subprocess.Popen([args.roomcastd, "--config", config], stderr=log, stdout=subprocess.DEVNULL)
    try:
        ports = {}
        deadline = time.monotonic() + 10
        while len(ports) < 2 and time.monotonic() < deadline:
            log.seek(0)
            for m in re.finditer(r"listening on 127\.0\.0\.1:(\d+) \((ltb|json)\)", log.read()):
                ports[m.group(2)] = int(m.group(1))
            time.sleep(0.05)
        if len(ports) < 2:
            raise RuntimeError("roomcastd did not start")

        observer = Peer("127.0.0.1", ports["ltb"])
        me = user("observer")
        observer.send(JOIN, me)

        victim = socket.socket()
        victim.bind(("127.0.0.2", 0))
        victim.connect(("127.0.0.1", ports[args.dialect]))
        if args.dialect == "json":
            body = json.dumps({"cmd": "nickname", "nickname": "victim"}).encode()
            victim.sendall(struct.pack("<I", len(body)) + body)
        else:
            victim.sendall(frame(JOIN, user("victim").SerializeToString()))
        while True:  # the observer sees both joins
            got = observer.frame(time.monotonic() + 5)
            if got is None:
                raise RuntimeError("no join from the victim")
            if got[0] == JOIN and REAL["UserInfo"].FromString(got[1]).name == "victim":
                break

        # The victim's network vanishes: nothing sent to 127.0.0.2 arrives.
        sh("ip rule add pref 100 lookup local && ip rule del pref 0 && ip rule add pref 50 to 127.0.0.2 blackhole")
        start = time.monotonic()
        left = None
        next_text = start
        while time.monotonic() - start < args.wait:
            now = time.monotonic()
            if now >= next_text:
                message = REAL["ChatMessage"]()
                message.user.CopyFrom(me)
                message.text = "still here?"
                observer.send(TEXT, message)
                if args.dialect == "ltb":
                    victim.sendall(frame(HEARTBEAT, b"alive"))
                next_text = now + 0.5
            got = observer.frame(min(next_text, start + args.wait))
            if got and got[0] == LEAVE and REAL["UserInfo"].FromString(got[1]).name == "victim":
                left = round(time.monotonic() - start, 2)
                break
        print(json.dumps({"dialect": args.dialect, "leave_after_s": left}))
    finally:
        daemon.terminate()
        daemon.wait(5)
        log.seek(0)
        sys.stderr.write(log.read()[-3000:])


if __name__ == "__main__":
    main()
