#!/usr/bin/env python3
"""Interop check: Python's `websockets` library (PyPI, an independent RFC 6455
client) joins roomcastd's WebSocket listener with subprotocol roomcast.json.v1.

  ws_peer.py --url ws://127.0.0.1:PORT/
  ws_peer.py --url wss://localhost:PORT/ --ca cert.pem [--origin https://host]

Over wss:// the TLS handshake is Python's ssl module verifying the daemon's
certificate against --ca (no --insecure: a wrong certificate fails). --origin
sends that Origin header, as a browser on that page would (RFC 6455 §4.1).

It joins as "py", says "hello from python", waits for an LTB client's
"hi python" (sent by the test once it saw the hello), keeps pinging every
100 ms (the library closes with 1011 if a pong is missing), then closes with
1000 and checks the daemon answered the close. Prints one JSON summary line;
exit 0 on success, 1 with a reason on stderr.
"""
import argparse
import asyncio
import json
import ssl
import sys

import websockets


async def run(url, ca=None, origin=None):
    context = ssl.create_default_context(cafile=ca) if url.startswith("wss:") else None
    async with websockets.connect(url, subprotocols=["roomcast.json.v1"], ping_interval=0.1, ping_timeout=2,
                                  open_timeout=5, close_timeout=5, ssl=context, origin=origin) as ws:
        if ws.subprotocol != "roomcast.json.v1":
            raise SystemExit(f"subprotocol {ws.subprotocol!r} chosen")

        async def expect(predicate, what):
            while True:
                message = await asyncio.wait_for(ws.recv(), 10)
                if not isinstance(message, str):
                    raise SystemExit(f"a binary message on roomcast.json.v1 while waiting for {what}")
                event = json.loads(message)
                if predicate(event):
                    return event

        await ws.send(json.dumps({"cmd": "nickname", "nickname": "py"}))
        await expect(lambda e: e.get("cmd") == "join" and e.get("nickname") == "py", "our join")
        await ws.send(json.dumps({"cmd": "msg", "content": "hello from python"}))
        await expect(lambda e: e.get("cmd") == "msg" and e.get("from") == "py", "our message")
        got = await expect(lambda e: e.get("cmd") == "msg" and e.get("from") == "alice", "alice's message")
        await asyncio.sleep(0.5)  # several pings answered meanwhile
        await ws.close(code=1000)
        rcvd = ws.protocol.close_rcvd  # the close frame the daemon sent back (websockets >= 14 API)
        code = rcvd.code if rcvd else None
        if code != 1000:
            raise SystemExit(f"the daemon answered the close with {code}")
        tls = ws.transport.get_extra_info("ssl_object") if url.startswith("wss:") else None
        return {"ok": True, "received": got["content"], "close": code, "tls": tls.version() if tls else None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", help="the CA file that verifies a wss:// server's certificate")
    parser.add_argument("--origin", help="the Origin header to send")
    args = parser.parse_args()
    try:
        summary = asyncio.run(run(args.url, args.ca, args.origin))
    except SystemExit as e:
        print(f"ws_peer: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a timeout, a refused upgrade, a 1011 for a missing pong
        print(f"ws_peer: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
