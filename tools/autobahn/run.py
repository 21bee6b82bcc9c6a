#!/usr/bin/env python3
"""Autobahn|Testsuite's fuzzing client against a release roomcastd's /echo.

Installs the pinned suite (Python 2.7 only) into a cache folder with
pyenv's 2.7.18 interpreter once, starts roomcastd with `[websocket]
echo = yes` on an ephemeral loopback port, runs the chosen case sections
and fails unless every case's behavior is OK, NON-STRICT or INFORMATIONAL
(UNIMPLEMENTED only for 12.* and 13.*, permessage-deflate, which roomcastd
declines: docs/protocol/websocket.md section 15). Writes the counts per behavior
as a Markdown summary (--summary).

  tools/autobahn/run.py --roomcastd .build/release/roomcastd \
      --cases 1,2,3,4,5,6,7,9,10 --summary docs/autobahn-summary.md
"""
import argparse
import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SUITE_VERSION = "25.10.1"
# What worked with Python 2.7.18 (the newest versions that still support it).
PINS = [
    "autobahntestsuite==25.10.1", "autobahn[twisted,accelerate]==0.10.9", "Twisted==19.10.0",
    "txaio==2.1.0", "cryptography==3.3.2", "pyOpenSSL==19.1.0", "zope.interface==4.6.0",
    "klein==17.10.0", "Werkzeug==1.0.1", "jinja2==2.11.3", "markupsafe==1.1.1",
    "service_identity==18.1.0", "incremental==16.10.1", "unittest2==1.1.0", "six==1.16.0",
]
ALLOWED = {"OK", "NON-STRICT", "INFORMATIONAL"}
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    print("test-autobahn: " + message, file=sys.stderr)
    sys.exit(1)


def python27():
    """pyenv's 2.7.18, or a loud failure: the suite runs on nothing newer."""
    candidates = []
    if os.environ.get("AUTOBAHN_PYTHON"):
        candidates.append(os.environ["AUTOBAHN_PYTHON"])
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
        candidates.append(os.path.join(root, "versions", "2.7.18", "bin", "python"))
    except (OSError, subprocess.CalledProcessError):
        pass
    candidates.append(os.path.expanduser("~/.pyenv/versions/2.7.18/bin/python"))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    fail("no Python 2.7.18 (looked at %s); Autobahn|Testsuite %s runs only on Python 2.7: "
         "install it with `pyenv install 2.7.18` or set AUTOBAHN_PYTHON" % (", ".join(candidates), SUITE_VERSION))


def install(py, cache):
    """The pinned suite in cache/site (pip --target), once; a marker file says it is complete."""
    site_dir = os.path.join(cache, "site")
    marker = os.path.join(cache, "installed")
    if os.path.exists(marker):
        with open(marker) as f:
            if f.read().split() == PINS:
                return site_dir
    shutil.rmtree(site_dir, ignore_errors=True)
    os.makedirs(cache, exist_ok=True)
    print("test-autobahn: installing Autobahn|Testsuite %s into %s" % (SUITE_VERSION, site_dir), flush=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-script-location",
                    "--target", site_dir] + PINS, check=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    with open(marker, "w") as f:
        f.write("\n".join(PINS) + "\n")
    return site_dir


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, deadline_s=30):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            fail("roomcastd exited with %d before listening" % proc.returncode)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    fail("roomcastd did not listen on 127.0.0.1:%d within %d s" % (port, deadline_s))


def allowed(case_id, behavior):
    if behavior in ALLOWED:
        return True
    return behavior == "UNIMPLEMENTED" and case_id.split(".")[0] in ("12", "13")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roomcastd", required=True)
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,9,10", help="comma-separated case sections")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/roomcast/autobahn-" + SUITE_VERSION))
    ap.add_argument("--summary", help="write the Markdown summary here")
    ap.add_argument("--keep", help="keep the suite's reports in this folder")
    args = ap.parse_args()

    py = python27()
    site_dir = install(py, args.cache)
    work = tempfile.mkdtemp(prefix="roomcast-autobahn-")
    port = free_port()
    conf = os.path.join(work, "roomcastd.conf")
    with open(conf, "w") as f:
        # 16 MiB: section 9 sends messages up to that size, and its echo must
        # fit the output queue (4 MiB by default closes the client at once).
        f.write("[limits]\noutput_soft_bytes = 40M\noutput_hard_bytes = 40M\n"
                "[websocket]\nlisten = 127.0.0.1:%d\necho = yes\nmax_message_bytes = 16M\n" % port)
    daemon_log = open(os.path.join(work, "roomcastd.log"), "w")
    daemon = subprocess.Popen([args.roomcastd, "--config", conf, "--listen", "127.0.0.1:0"],
                              stdout=daemon_log, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, daemon)
        sections = [c.strip() for c in args.cases.split(",") if c.strip()]
        spec = {
            "outdir": os.path.join(work, "reports"),
            "servers": [{"agent": "roomcastd", "url": "ws://127.0.0.1:%d/echo" % port}],
            "cases": [s + ".*" for s in sections],
            "exclude-cases": [],
            "exclude-agent-cases": {},
        }
        with open(os.path.join(work, "spec.json"), "w") as f:
            json.dump(spec, f)
        start = time.monotonic()
        run = subprocess.run([py, os.path.join(HERE, "wstest.py"), site_dir, "-m", "fuzzingclient", "-s", "spec.json"],
                             cwd=work, capture_output=True, text=True, timeout=900,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"))
        seconds = time.monotonic() - start
        if run.returncode != 0:
            fail("wstest exited with %d:\n%s%s" % (run.returncode, run.stdout[-4000:], run.stderr[-4000:]))
        if daemon.poll() is not None:
            fail("roomcastd exited with %d during the suite" % daemon.returncode)
        with open(os.path.join(work, "reports", "index.json")) as f:
            results = json.load(f)["roomcastd"]
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        daemon_log.close()

    def key(case_id):
        return [int(p) for p in case_id.split(".")]

    per_section = collections.defaultdict(collections.Counter)
    totals = collections.Counter()
    bad = []
    for case_id in sorted(results, key=key):
        r = results[case_id]
        b = r["behavior"]
        per_section[case_id.split(".")[0]][b] += 1
        totals[b] += 1
        if not allowed(case_id, b) or r.get("behaviorClose") not in ALLOWED | {"UNIMPLEMENTED"}:
            bad.append("%s: behavior %s, close %s" % (case_id, b, r.get("behaviorClose")))
    behaviors = sorted(totals)
    lines = ["# Autobahn|Testsuite %s against roomcastd" % SUITE_VERSION, "",
             "The fuzzing client's cases %s against `ws://127.0.0.1:PORT/echo` of a release roomcastd with "
             "`[websocket] echo = yes`, `max_message_bytes = 16M` and `[limits] output_hard_bytes = 40M` (`make test-autobahn`, "
             "tools/autobahn/run.py); %d cases in %.0f s." % (", ".join(sections), sum(totals.values()), seconds), "",
             "| section | " + " | ".join(behaviors) + " |", "|---|" + "---|" * len(behaviors)]
    for s in sorted(per_section, key=int):
        lines.append("| %s | " % s + " | ".join(str(per_section[s][b]) for b in behaviors) + " |")
    lines.append("| all | " + " | ".join(str(totals[b]) for b in behaviors) + " |")
    lines += ["", "Accepted: OK, NON-STRICT, INFORMATIONAL (and UNIMPLEMENTED for 12 and 13, permessage-deflate, "
              "which roomcastd declines). Not accepted: %d." % len(bad)]
    summary = "\n".join(lines) + "\n"
    print(summary)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(summary)
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        shutil.copytree(os.path.join(work, "reports"), args.keep)
    shutil.rmtree(work, ignore_errors=True)
    if bad:
        fail("%d cases not accepted:\n  " % len(bad) + "\n  ".join(bad))


if __name__ == "__main__":
    main()
