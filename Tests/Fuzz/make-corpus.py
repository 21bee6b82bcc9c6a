#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets (Tests/Fuzz/corpus/<target>/):
real frames and bodies as the original clients send them, the hostile inputs
of the hostile-input tests, and config files. Re-run after changing it; the output is committed."""
import base64, hashlib, hmac, json, os, shutil, struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "corpus")

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)

def tag(field, wire): return varint(field << 3 | wire)
def ld(field, payload): return tag(field, 2) + varint(len(payload)) + payload
def vi(field, value): return tag(field, 0) + varint(value)
def s(text): return text.encode()

def user(level, name, icon, room=None):
    b = vi(1, level) + ld(2, s(name)) + ld(3, s(icon))
    return b + (ld(4, s(room)) if room is not None else b"")

def chat(u, text): return ld(1, u) + ld(2, s(text))
def gift(u, name, url, count): return ld(1, u) + ld(2, s(name)) + ld(3, s(url)) + vi(4, count)

def frame(type_, body, order="<"): return struct.pack(order + "IH", len(body), type_) + body

ALICE = user(3, "alice", "https://img.example/alice.png")
BOB = user(-1, "bob 你好", "https://img.example/bob.png", room="room-b")
HEARTBEAT = frame(8, s("this is a heartBeat message "))

bodies = {
    "user": ALICE,
    "user-room": BOB,
    "chat": chat(ALICE, "hello 你好 🎉"),
    "chat-empty-text": chat(ALICE, ""),
    "gift": gift(BOB, "rocket", "https://img.example/rocket.gif", 3),
    "gift-negative": gift(ALICE, "rose", "u", -5),
    "chat-unknown-15": chat(ALICE, "fine") + ld(15, s("f15")),
    "chat-group": chat(ALICE, "g") + tag(9, 3) + vi(1, 7) + tag(9, 4),
    "chat-user-twice": ld(1, vi(1, 1) + ld(2, s("a"))) + ld(1, ld(3, s("i"))) + ld(2, s("merged")),
    "bad-text-missing": ld(1, ALICE),
    "bad-user-missing-name": ld(1, vi(1, 3)) + ld(2, s("hi")),
    "bad-utf8": ld(1, ALICE) + ld(2, b"\xF0\x80"),
    "bad-length-past-end": ld(1, ALICE) + tag(2, 2) + varint(100) + s("short"),
    "bad-varint-11": tag(1, 0) + b"\xFF" * 10 + b"\x01" + ALICE[2:],
    "bad-wire-type": vi(1, 3) + vi(2, 5) + ALICE[2:],
    "empty": b"",
}

streams = {
    "session": frame(0, ALICE) + frame(2, chat(ALICE, "hi")) + frame(8, b"*") + frame(77, bytes([9, 8, 7])),
    "seed000": frame(0, BOB) + HEARTBEAT + frame(3, bodies["gift"]) + frame(1, BOB),
    "empties": frame(99, b"") + frame(8, b"") * 10 + frame(2, b""),
    "http": s("GET / HTTP/1.1\r\nHost: roomcast.example\r\n\r\n"),
    "tls": bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03]) + bytes(40),
    "oversize": struct.pack("<IH", 1025, 2) + b"\x0a\x00",
    "partial": frame(2, chat(ALICE, "cut"))[:-3],
    "bytes-1019-1024": b"".join(frame(42, bytes(range(256)) * 4 + bytes(n - 1024)) if n >= 1024 else frame(42, (bytes(range(256)) * 4)[:n]) for n in range(1019, 1025)),
}

def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

shutil.rmtree(ROOT, ignore_errors=True)
for name, body in bodies.items():
    write("FuzzProto2", name, body)
for name, stream in streams.items():
    # [flags: byte order bit + chunk-size index, limit index, seed, seed] + stream
    write("FuzzFrameDecoder", name, bytes([0x00, 6, 0x12, 0x34]) + stream)
    write("FuzzFrameDecoder", name + "-1byte", bytes([0x00, 5, 0x56, 0x78]) + stream)
write("FuzzFrameDecoder", "session-big-endian", bytes([0x09, 6, 0x9A, 0xBC]) + b"".join(
    frame(t, b, ">") for t, b in [(0, ALICE), (2, bodies["chat"]), (8, b"")]))

conf = os.path.join(HERE, "..", "..", "config", "roomcastd.conf")
with open(conf, "rb") as f:
    write("FuzzConfig", "roomcastd.conf", f.read())
configs = {
    "small": "[server]\nlisten = 127.0.0.1:9898\nlisten = [::1]:9898\nmax_clients = 100\n\n[protocol]\nmax_frame_bytes = 16M\n"
             "[limits]\noutput_hard_bytes = 17M\noutput_soft_bytes = 256K\noutput_soft_seconds = 2s\n",
    "bad-value": "[heartbeat]\ntimeout = soon\n",
    "bad-section": "[srever]\nlisten = 0.0.0.0:1\n",
    "cross-rule": "[protocol]\njoin_type = 8\n\n[limits]\noutput_soft_bytes = 8M\n",
    "crlf-bom": "\ufeff[log]\r\nlevel = debug\r\n; comment\r\n# comment\r\n",
    "json": "[json]\nlisten = 127.0.0.1:9899\nheartbeat_timeout = 0\ntcp_keepalive = 60s\n",
    "no-section": "key = value\n",
}
for name, text in configs.items():
    write("FuzzConfig", name, text.encode())

# FuzzWebSocket: [flags, limit, seed] + an upgrade request (flags bit 0) or client frames.
def ws(first, payload, key=b"\x37\xfa\x21\x3d", masked=True):
    n = len(payload)
    m = 0x80 if masked else 0
    out = bytes([first])
    if n <= 125: out += bytes([m | n])
    elif n <= 0xFFFF: out += bytes([m | 126]) + n.to_bytes(2, "big")
    else: out += bytes([m | 127]) + n.to_bytes(8, "big")
    return out + (key + bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if masked else payload)

UPGRADE = (b"GET /?room=r1 HTTP/1.1\r\nHost: 127.0.0.1:9897\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://a\r\nSec-WebSocket-Protocol: roomcast.ltb.v1\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n")
websocket = {
    "http-upgrade": b"\x01\x07\x11" + UPGRADE,
    "http-upgrade-1byte": b"\x00\x07\x12" + UPGRADE,  # flags 0: the same bytes as frames
    "rfc-masked-hello": b"\x06\x06\x22" + bytes([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]),
    "fragments-ping": b"\x02\x06\x33" + ws(0x01, b"Hel") + ws(0x89, b"p") + ws(0x00, b"l") + ws(0x8A, b"") + ws(0x80, b"o"),
    "utf8-split": b"\x04\x06\x44" + ws(0x01, b"a\xce") + ws(0x80, b"\xba\xe1\xbd\xb9"),
    "utf8-bad-split": b"\x04\x06\x45" + ws(0x01, b"a\xe0") + ws(0x00, b"\x80\x80") + ws(0x80, b"a"),
    "close": b"\x06\x06\x55" + ws(0x88, b"\x03\xe8bye") + ws(0x88, b"\x03"),
    "unmasked": b"\x06\x06\x66" + ws(0x81, b"Hello", masked=False),
    "binary-300": b"\x08\x06\x77" + ws(0x82, bytes(range(256)) + bytes(44)),
    "binary-70000": b"\x0a\x07\x78" + ws(0x82, bytes(70000)),
    "oversize-header": b"\x06\x03\x79" + bytes([0x82, 0xFF, 0, 0, 0, 0, 0x40, 0, 0, 0, 1, 2, 3, 4]),
}
for name, data in websocket.items():
    write("FuzzWebSocket", name, data)

# PROXY protocol headers (docs/protocol/proxy.md section 14; HAProxy's proxy-protocol.txt), alone and
# followed by a client's first frame, and the proxy_from prefixes.
SIG = b"\r\n\r\n\x00\r\nQUIT\n"
def v2(cmd, fam, body): return SIG + bytes([cmd, fam]) + struct.pack(">H", len(body)) + body
ff = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
proxy = {
    "v1-tcp4": b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 9898\r\n",
    "v1-tcp4-worst": b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
    "v1-tcp6": b"PROXY TCP6 2001:db8::7 ::1 51234 9898\r\n",
    "v1-unknown": b"PROXY UNKNOWN\r\n",
    "v1-unknown-worst": ("PROXY UNKNOWN %s %s 65535 65535\r\n" % (ff, ff)).encode(),
    "v1-then-frame": b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 9898\r\n\x05\x00\x00\x00\x02\x00hello",
    "v1-bad-port": b"PROXY TCP4 192.0.2.7 198.51.100.1 080 9898\r\n",
    "v2-tcp4": v2(0x21, 0x11, bytes([192, 0, 2, 7, 198, 51, 100, 1]) + struct.pack(">HH", 51234, 9898)),
    "v2-tcp6-tlv": v2(0x21, 0x21, bytes(15) + b"\x07" + bytes(15) + b"\x01" + struct.pack(">HH", 443, 9898)
                      + b"\x01\x00\x02h2\x04\x00\x01\x00"),
    "v2-local": v2(0x20, 0x00, b""),
    "v2-unix": v2(0x21, 0x31, bytes(216)),
    "v2-short": v2(0x21, 0x11, bytes(8)),
    "v2-then-json": v2(0x21, 0x11, bytes([10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 0, 81])) + b"\x02\x00\x00\x00{}",
    "prefix-v4": b"10.0.0.0/8",
    "prefix-v6": b"fd00::/8",
}
for name, data in proxy.items():
    write("FuzzProxyHeader", name, data)

# FuzzHTTP: [chunk, seed] + a stream of API requests (docs/api.md).
def api_post(body, extra=b""):
    return (b"POST /v1/rooms/r%20b/publish HTTP/1.1\r\nHost: 127.0.0.1:9899\r\nAuthorization: Bearer k0123456789abcdef\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)
http = {
    "publish": b"\x05\x11" + api_post(b'{"type":"text","user":{"name":"bot"},"text":"hi"}'),
    "publish-1byte": b"\x00\x12" + api_post(b'{"type":"gift","user":{"name":"bot"},"gift":"rose","count":1}'),
    "pipelined": b"\x02\x13" + b"GET /healthz HTTP/1.1\r\n\r\n" + api_post(b"{}")
                 + b"GET /v1/rooms?cursor=abc HTTP/1.1\r\nConnection: close\r\n\r\n",
    "chunked": b"\x03\x14" + b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "too-large": b"\x04\x15" + b"POST / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n",
    "expect": b"\x01\x16" + api_post(b"12345", b"Expect: 100-continue\r\n"),
    "two-lengths": b"\x05\x17" + b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2, 3\r\n\r\nab",
}
for name, data in http.items():
    write("FuzzHTTP", name, data)

# FuzzToken: compact JWS tokens (RFC 7515) with the claims of docs/protocol/tokens.md,
# and a claims object alone; signatures are HMAC-SHA256 with a fixed key (the
# target parses, it does not verify against a key file).
def b64url(data): return base64.urlsafe_b64encode(data).rstrip(b"=")
def jws(header, claims):
    signing_input = b64url(json.dumps(header).encode()) + b"." + b64url(json.dumps(claims).encode())
    return signing_input + b"." + b64url(hmac.new(b"fuzz", signing_input, hashlib.sha256).digest())
tokens = {
    "claims": json.dumps({"sub": "\U0001F600", "exp": 1, "rooms": ["*"], "x": [{"a": [1, 2500.0, 0, True, False, None]}]}).encode(),
    "token0": jws({"alg": "HS256", "kid": "a"}, {"sub": "alice", "exp": 1800000000, "rooms": ["lobby"], "may": ["text", 42]}),
    "token1": jws({"alg": "EdDSA", "kid": "e", "typ": "JWT"}, {"sub": "b\u00e9", "exp": 1500000000.0, "nbf": 1, "name": "Bob",
                                                         "level": 3, "icon": "http://x", "role": "moderator"}),
    "token2": jws({"alg": "none", "kid": "a"}, {"sub": "x", "exp": 0}),
}
for name, data in tokens.items():
    write("FuzzToken", name, data)

# FuzzModerationWire: what a daemon reads from Redis (docs/api.md "Across the
# cluster"): control-channel messages whole, and the moderation hash's
# field and value joined by a newline, as the daemons write them.
moderation = {
    "control-ban": b"00c0ffee12345678 set ban:live%2042:user-1234 1764651600000 1764648000000 spam%20links",
    "control-mute": b"00c0ffee12345678 set mute:live%2042:user%3A1%20%C3%A9 1764651600000 1764648000000 ",
    "control-removed": b"0123456789abcdef set ban:live%2042:user-1234 1764651600000 1764649000000 !",
    "control-settings": b"0123456789abcdef set settings:live%2042 10 1764648000000",
    "control-kick-sub": b"fedcba9876543210 kick live%2042 sub user-1234",
    "control-kick-name": b"fedcba9876543210 kick live%2042 name bob%20%E4%BD%A0%E5%A5%BD",
    "hash-ban": b"ban:live%2042:user-1234\n1764651600000 1764648000000 spam%20links",
    "hash-mute-bang": b"mute:r:s\n9 8 %21",
    "hash-removed": b"mute:r:s\n1764651600000 1764649000000 !",
    "hash-settings": b"settings:a%3Ab\n120 1764648000000",
    "hash-settings-off": b"settings:lobby\n0 1764648000001",
    "hash-foreign": b"kick:r:s\n1 1 x",
}
for name, data in moderation.items():
    write("FuzzModerationWire", name, data)
