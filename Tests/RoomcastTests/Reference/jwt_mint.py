#!/usr/bin/env python3
"""Mints tokens for the signed-join tests with PyJWT (an implementation
that is not ours). One JSON request per line on stdin, one answer per line
on stdout:

  {"op": "pub", "seed": B64URL}            -> the Ed25519 public key (base64url)
  {"alg": "HS256", "secret": B64URL, "kid": K, "claims": {...}}
  {"alg": "EdDSA", "seed": B64URL, "kid": K, "claims": {...}}
  {"alg": "none", "kid": K, "claims": {...}}
  optional "tamper": true  -> the payload replaced by one with "sub": "mallory",
                              the signature kept

Needs `pip install pyjwt cryptography` (make deps)."""
import base64, json, sys
import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization

def unb64(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))

def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

for line in sys.stdin:
    if not line.strip():
        continue
    r = json.loads(line)
    if r.get("op") == "pub":
        k = Ed25519PrivateKey.from_private_bytes(unb64(r["seed"]))
        print(b64(k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)))
        continue
    alg = r["alg"]
    headers = {"kid": r["kid"]}
    if alg == "HS256":
        key = unb64(r["secret"])
    elif alg == "EdDSA":
        key = Ed25519PrivateKey.from_private_bytes(unb64(r["seed"]))
    else:
        key = None
    token = jwt.encode(r["claims"], key, algorithm=alg, headers=headers)
    if r.get("tamper"):
        h, p, s = token.split(".")
        claims = dict(r["claims"], sub="mallory", name="mallory")
        token = ".".join([h, b64(json.dumps(claims, separators=(",", ":")).encode()), s])
    print(token)
    sys.stdout.flush()
