#!/usr/bin/env python3
"""The chat page in a real browser: headless Chromium from Debian, driven
by Selenium with Debian's chromedriver (no downloads).

Starts a release roomcastd on ephemeral loopback ports with the WebSocket
listener serving web/ (`[websocket] page = yes`), opens the page twice
(two tabs, ?room=stage) and connects one LTB client to the same room;
the three converse (join, text both ways, a gift, a leave). Asserts on
the DOM of both tabs, on the LTB frames, and on the WebSocket frames the
first tab sent and received (Chromium's DevTools performance log); then
restarts the daemon and checks that the page shows the state, reconnects
and joins again. Saves a screenshot (--screenshot). Waits on state with
deadlines, never on fixed sleeps.

  tools/browser/test_browser.py --roomcastd .build/release/roomcastd \\
      --web web --screenshot docs/images/browser-chat.png
"""
import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

JOIN, LEAVE, TEXT, GIFT = 0, 1, 2, 3
ROOM = "stage"
DEADLINE_S = 20


def fail(message):
    print("test-browser: FAILED: " + message, file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------ LTB (docs/protocol.md sections 1-3)

def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def user_info(name, room=ROOM):
    return field(1, 0) + field(2, name.encode()) + field(3, b"") + field(4, room.encode())


def frame(kind, body):
    return struct.pack("<IH", len(body), kind) + body


def parse_fields(body):
    """proto2 fields as {number: value} (last wins), enough for UserInfo, ChatMessage, GiftMessage."""
    out, i = {}, 0
    while i < len(body):
        key, i = read_varint(body, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out[number], i = read_varint(body, i)
        elif wire == 2:
            n, i = read_varint(body, i)
            out[number] = body[i:i + n]
            i += n
        else:
            raise ValueError("wire type %d" % wire)
    return out


def read_varint(b, i):
    shift = value = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return value, i


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

    def expect(self, kind, name, text=None):
        """Skips frames until one of `kind` from `name` (and `text`) arrives, within the deadline."""
        seen = []
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            k, body = self.next_frame()
            f = parse_fields(body)
            if k in (JOIN, LEAVE):
                who, said = f.get(2, b"").decode(), None
            else:
                who, said = parse_fields(f.get(1, b"")).get(2, b"").decode(), f.get(2, b"").decode()
            seen.append((k, who, said))
            if k == kind and who == name and (text is None or said == text):
                return
        fail("the LTB client did not get %s from %s (%r); it got %r" % (kind, name, text, seen))


# ------------------------------------------------------------ the daemon

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(binary, conf, ltb_port, log_path):
    log = open(log_path, "a")
    p = subprocess.Popen([binary, "--config", conf, "--listen", "127.0.0.1:%d" % ltb_port],
                         stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if p.poll() is not None:
            fail("roomcastd exited with %d:\n%s" % (p.returncode, open(log_path).read()[-2000:]))
        try:
            socket.create_connection(("127.0.0.1", ltb_port), timeout=1).close()
            return p
        except OSError:
            time.sleep(0.05)
    fail("roomcastd did not listen within %d s" % DEADLINE_S)


def stop_daemon(p):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# ------------------------------------------------------------ the browser

def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=900,640",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=options)


def wait(driver, what, condition):
    try:
        return WebDriverWait(driver, DEADLINE_S, poll_frequency=0.05).until(lambda d: condition(d))
    except TimeoutException:
        log = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#log li")]
        fail("%s: not within %d s (state %r, log %r)" % (what, DEADLINE_S, driver.find_element(By.ID, "state").text, log))


def state(driver):
    return driver.find_element(By.ID, "state").get_attribute("data-state")


def log_lines(driver):
    return [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#log li")]


def wait_line(driver, tab, line):
    wait(driver, "%s shows %r" % (tab, line), lambda d: line in log_lines(d))


def join(driver, name):
    driver.find_element(By.ID, "nickname").send_keys(name)
    driver.find_element(By.ID, "join-button").click()
    wait(driver, "the say form, not the join form, after joining",
         lambda d: d.find_element(By.ID, "say").is_displayed() and not d.find_element(By.ID, "join").is_displayed())


def say(driver, text):
    box = driver.find_element(By.ID, "text")
    box.send_keys(text)
    driver.find_element(By.ID, "send-button").click()
    wait(driver, "the text box clears after sending", lambda d: d.find_element(By.ID, "text").get_attribute("value") == "")


def websocket_frames(driver):
    """{tab's DevTools target: [(direction, payload)]} of the WebSocket frames in the performance log so far."""
    out = {}
    for entry in driver.get_log("performance"):
        record = json.loads(entry["message"])
        m = record["message"]
        if m["method"] in ("Network.webSocketFrameSent", "Network.webSocketFrameReceived"):
            out.setdefault(record.get("webview"), []).append(
                ("sent" if m["method"].endswith("Sent") else "received", m["params"]["response"]["payloadData"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roomcastd", required=True)
    ap.add_argument("--web", required=True, help="the page's directory (web/)")
    ap.add_argument("--screenshot")
    args = ap.parse_args()
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="roomcast-browser-")
    ltb_port, ws_port = free_port(), free_port()
    conf = os.path.join(work, "roomcastd.conf")
    with open(conf, "w") as f:
        # heartbeat.timeout = 0: the LTB client here sends no heartbeats.
        f.write("[heartbeat]\ntimeout = 0\n[websocket]\nlisten = 127.0.0.1:%d\npage = yes\npage_dir = %s\n"
                % (ws_port, os.path.abspath(args.web)))
    daemon_log = os.path.join(work, "roomcastd.log")
    daemon = start_daemon(args.roomcastd, conf, ltb_port, daemon_log)
    driver = None
    try:
        driver = browser()
        url = "http://127.0.0.1:%d/?room=%s" % (ws_port, ROOM)
        driver.get(url)
        tab_a = driver.current_window_handle
        wait(driver, "tab A connects on load", lambda d: state(d) == "open")
        if driver.title != "roomcast #" + ROOM:
            fail("tab A's title is %r" % driver.title)
        driver.switch_to.new_window("tab")
        tab_b = driver.current_window_handle
        driver.get(url)
        wait(driver, "tab B connects on load", lambda d: state(d) == "open")

        ltb = LTBClient(ltb_port)
        ltb.send(JOIN, user_info("bob"))
        ltb.expect(JOIN, "bob")  # echo = yes: its own join back

        driver.switch_to.window(tab_b)
        join(driver, "carol")
        ltb.expect(JOIN, "carol")
        wait_line(driver, "tab B", "carol joined")
        driver.switch_to.window(tab_a)
        join(driver, "alice")
        ltb.expect(JOIN, "alice")
        wait_line(driver, "tab A", "alice joined")
        if any("carol" in line or "bob" in line for line in log_lines(driver)):
            fail("tab A showed the room before it joined: %r" % log_lines(driver))
        driver.switch_to.window(tab_b)
        wait_line(driver, "tab B", "alice joined")

        # Tab A speaks: tab B and the LTB client hear it.
        driver.switch_to.window(tab_a)
        say(driver, "hello from a browser, ça va ?")
        wait_line(driver, "tab A", "alice: hello from a browser, ça va ?")
        ltb.expect(TEXT, "alice", "hello from a browser, ça va ?")
        driver.switch_to.window(tab_b)
        wait_line(driver, "tab B", "alice: hello from a browser, ça va ?")
        say(driver, "hi alice <b>not bold</b>")
        ltb.expect(TEXT, "carol", "hi alice <b>not bold</b>")

        # The LTB client speaks and sends a gift: both tabs show them.
        ltb.send(TEXT, field(1, user_info("bob")) + field(2, "hello browsers".encode()))
        ltb.send(GIFT, field(1, user_info("bob")) + field(2, b"rose") + field(3, b"https://example.com/rose.png") + field(4, 3))
        for handle, tab in ((tab_a, "tab A"), (tab_b, "tab B")):
            driver.switch_to.window(handle)
            wait_line(driver, tab, "bob: hello browsers")
            wait_line(driver, tab, "bob sent 3 \u00d7 rose")
            wait_line(driver, tab, "carol: hi alice <b>not bold</b>")
            if driver.find_elements(By.CSS_SELECTOR, "#log b"):
                fail("%s rendered a sender's markup" % tab)

        # Tab B goes away: tab A and the LTB client see carol leave.
        driver.switch_to.window(tab_b)
        driver.close()
        driver.switch_to.window(tab_a)
        wait_line(driver, "tab A", "carol left")
        ltb.expect(LEAVE, "carol")

        # What tab A's WebSocket carried (DevTools): the JSON dialect, one object a message.
        want_sent = [{"cmd": "nickname", "nickname": "alice", "room": ROOM},
                     {"cmd": "msg", "content": "hello from a browser, ça va ?"}]
        by_tab = websocket_frames(driver)
        tab_frames = [f for f in by_tab.values() if any(d == "sent" and json.loads(p) == want_sent[0] for d, p in f)]
        if len(tab_frames) != 1:
            fail("no single tab sent alice's join: %r" % by_tab)
        sent = [json.loads(p) for d, p in tab_frames[0] if d == "sent"]
        received = [json.loads(p) for d, p in tab_frames[0] if d == "received"]
        if sent != want_sent:
            fail("tab A sent %r, not %r" % (sent, want_sent))
        for want in ({"cmd": "msg", "from": "bob", "content": "hello browsers"},
                     {"cmd": "gift", "from": "bob", "giftname": "rose", "giftURL": "https://example.com/rose.png", "giftcount": 3}):
            if want not in received:
                fail("tab A did not receive %r (received %r)" % (want, received))
        if not any(m.get("cmd") == "leave" and m.get("nickname") == "carol" for m in received):
            fail("tab A received no leave of carol: %r" % received)

        if args.screenshot:
            os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
            driver.save_screenshot(args.screenshot)

        # A restart (a stop, then a new daemon on the same ports; WebSocket connections are not
        # handed over, docs/protocol.md section 15): the page shows it, reconnects with backoff and joins again.
        ltb.sock.close()
        stop_daemon(daemon)
        wait(driver, "tab A shows the closed state", lambda d: state(d) == "closed")
        daemon = start_daemon(args.roomcastd, conf, ltb_port, daemon_log)
        ltb = LTBClient(ltb_port)
        ltb.send(JOIN, user_info("bob"))
        ltb.expect(JOIN, "bob")
        wait(driver, "tab A reconnects", lambda d: state(d) == "open")
        ltb.expect(JOIN, "alice")
        closed = [line for line in log_lines(driver) if line.startswith("connection closed (")]
        if not closed or not closed[0].startswith("connection closed (1001"):
            fail("tab A did not show the 1001 close: %r" % closed)
        print("test-browser: 2 tabs and 1 LTB client conversed in room %r; reconnect after a restart; %.1f s"
              % (ROOM, time.monotonic() - start))
    finally:
        if driver is not None:
            driver.quit()
        stop_daemon(daemon)


if __name__ == "__main__":
    main()
