#!/usr/bin/env python3
"""The chat page in a real browser: headless Chromium from Debian, driven
by Selenium with Debian's chromedriver (no downloads).

Starts a release roomcastd on ephemeral loopback ports with the WebSocket
listener serving web/ (`[websocket] page = yes`), under a fake PID 1 with
an fd store (fake_systemd.py: what systemd 252 does for the shipped
standalone unit), opens the page twice (two tabs, ?room=stage) and
connects one LTB client to the same room; the three converse (join, text
both ways, a gift). Asserts on the DOM of both tabs and on the LTB frames.

Issue 23 (`[rooms] history = 50`): a third tab, behind a loopback link the
test can reset and hold (PhoneLink: a phone's network), joins after those
lines and shows them; a reset while bob talks, then a reconnect, resumes
with "since" and shows every line once; so does a reset between a text and
its position notice; a `skipped` notice (inserted by the link) shows inline.
Against a roomcastd without positions the reconnects reload the recent
lines instead (said so on stdout), once each all the same.

Then two restarts that must keep everyone (docs/protocol/websocket.md section 15,
"Restarts"): each of the three sends before, while no roomcastd process
runs (the messages wait in the kernel) and after; both tabs show every
message once, in each sender's order, and never their reconnect state
(#state's data-state stays `open`, data-reconnects `0`). With --crash (as
`make test-browser` runs it), a third round is a SIGKILL that must keep them too.
Then a tab leaves, and tab A's WebSocket traffic (Chromium's DevTools
performance log) is checked: one WebSocket for the whole run, one join,
the JSON dialect both ways. Last, a stop (the fd store emptied) and a
daemon without systemd: the page shows the closed state, reconnects and
joins again, and shows the 1001 close of that daemon's stop.

Saves a screenshot of the conversation (--screenshot) and one after the
restarts (--restart-screenshot). Waits on state with deadlines, never on
fixed sleeps. `--fdstore-max 0` runs the daemon without an fd store: the
restarts then drop the WebSockets and the test fails.

  tools/browser/test_browser.py --roomcastd .build/release/roomcastd --web web \\
      --screenshot docs/images/browser-chat.png --restart-screenshot docs/images/browser-restart.png
"""
import argparse
import json
import os
import socket
import subprocess
import tempfile
import time

from fake_systemd import FakeSystemd, ServiceError
from peers import DEADLINE_S, GIFT, JOIN, LEAVE, ROOM, TEXT, LTBClient, PhoneLink, fail, user_info
from chatpool import field  # noqa: E402 (peers.py puts systemd/ on the path)
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
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
        log = log_lines(driver)
        fail("%s: not within %d s (state %r, log %r)" % (what, DEADLINE_S, driver.find_element(By.ID, "state").text, log))


def state(driver):
    return driver.find_element(By.ID, "state").get_attribute("data-state")


def log_lines(driver):
    # One script, not an element each: a reload empties the log while it is read.
    return driver.execute_script('return Array.from(document.querySelectorAll("#log li"), li => li.innerText.trim());')


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


def reconnects(driver):
    return int(driver.find_element(By.ID, "state").get_attribute("data-reconnects"))


def websocket_events(driver):
    """{tab's DevTools target: [(event, payload)]} of the WebSocket events in the performance log
    since the last call: "created" (a new WebSocket), "sent", "received", "closed"."""
    kinds = {"Network.webSocketCreated": "created", "Network.webSocketFrameSent": "sent",
             "Network.webSocketFrameReceived": "received", "Network.webSocketClosed": "closed"}
    out = {}
    for entry in driver.get_log("performance"):
        record = json.loads(entry["message"])
        m = record["message"]
        if m["method"] in kinds:
            kind = kinds[m["method"]]
            payload = m["params"]["response"]["payloadData"] if kind in ("sent", "received") else None
            out.setdefault(record.get("webview"), []).append((kind, payload))
    return out


def texts_from(lines, name):
    """What `name` said, in the order a tab's log shows it."""
    prefix = name + ": "
    return [line[len(prefix):] for line in lines if line.startswith(prefix)]


def kept_restart(service, driver, tabs, ltb, round_no, crash=False):
    """One restart that must keep both tabs and the LTB client: messages from
    each of the three before it, while no roomcastd process runs (they wait
    in the kernel), and after it; each tab shows every one once, in each
    sender's order, and never its reconnect state."""
    (tab_a, tab_b) = tabs
    said = {"alice": [], "carol": [], "bob": []}

    def say_all(phase):
        """One message from each of the three, then each tab shows all three."""
        for handle, name in ((tab_a, "alice"), (tab_b, "carol")):
            driver.switch_to.window(handle)
            text = "%s restart %d from %s" % (phase, round_no, name)
            say(driver, text)
            said[name].append(text)
        text = "%s restart %d from bob" % (phase, round_no)
        ltb.send(TEXT, field(1, user_info("bob")) + field(2, text.encode()))
        said["bob"].append(text)
        for handle, tab in ((tab_a, "tab A"), (tab_b, "tab B")):
            driver.switch_to.window(handle)
            for name in said:
                wait_line(driver, tab, "%s: %s" % (name, said[name][-1]))

    # Before: sent and shown everywhere while the daemon runs.
    say_all("before")

    sending = []

    def while_stopped():
        begun = time.monotonic()
        # No roomcastd runs: the tabs' WebSockets and the LTB socket are open
        # in the fd store only; what they send waits in the kernel.
        for handle, name in ((tab_a, "alice"), (tab_b, "carol")):
            driver.switch_to.window(handle)
            if state(driver) != "open" or reconnects(driver) != 0:
                fail("restart %d: %s's tab showed its reconnect state while roomcastd was stopped (state %r, "
                     "data-reconnects %d, log %r); roomcastd log:\n%s"
                     % (round_no, name, state(driver), reconnects(driver), log_lines(driver)[-6:], service.log_tail()))
            for i in (1, 2):
                text = "during restart %d from %s (%d)" % (round_no, name, i)
                say(driver, text)
                said[name].append(text)
        for i in (1, 2):
            text = "during restart %d from bob (%d)" % (round_no, i)
            ltb.send(TEXT, field(1, user_info("bob")) + field(2, text.encode()))
            said["bob"].append(text)
        sending.append(time.monotonic() - begun)

    t0 = time.monotonic()
    if crash:
        service.crash_restart(while_stopped)
    else:
        status = service.restart(while_stopped)
        if status != 0:
            fail("restart %d: roomcastd exited with %d, not 0 (a hand-over):\n%s" % (round_no, status, service.log_tail()))
    # The restart's own time: SIGTERM to READY=1, less the test's sending while stopped.
    gap_ms = (time.monotonic() - t0 - sending[0]) * 1000
    for handle, tab in ((tab_a, "tab A"), (tab_b, "tab B")):
        driver.switch_to.window(handle)
        if state(driver) != "open" or reconnects(driver) != 0:
            fail("restart %d: %s showed its reconnect state (state %r, data-reconnects %d, log %r); roomcastd log:\n%s"
                 % (round_no, tab, state(driver), reconnects(driver), log_lines(driver)[-6:], service.log_tail()))
        for name in said:
            wait_line(driver, tab, "%s: %s" % (name, said[name][-1]))
    # After: sent only once the "during" ones are shown, so that the three
    # phases cannot interleave between senders either.
    say_all("after")
    for handle, tab in ((tab_a, "tab A"), (tab_b, "tab B")):
        driver.switch_to.window(handle)
        lines = log_lines(driver)
        for name in said:
            shown = [t for t in texts_from(lines, name) if "restart %d " % round_no in t]
            if shown != said[name]:
                fail("restart %d: %s shows %s's messages as %r, not %r once each in order" % (round_no, tab, name, shown, said[name]))
        if state(driver) != "open" or reconnects(driver) != 0 or any(l.startswith("connection closed") for l in lines):
            fail("restart %d: %s reconnected (state %r, data-reconnects %d)" % (round_no, tab, state(driver), reconnects(driver)))
    # The LTB client, kept too, got every message of the round once, in each sender's order.
    marker = "restart %d " % round_no
    got = ltb.texts(lambda g: all(len(g.get(n, [])) >= len(said[n]) for n in said), keep=lambda t: marker in t)
    for name in said:
        if got.get(name, []) != said[name]:
            fail("restart %d: the LTB client got %s's messages as %r, not %r once each in order"
                 % (round_no, name, got.get(name, []), said[name]))
    return gap_ms


NUMBERED = ("alice: ", "carol: ", "bob: ", "bob sent ")


def numbered_lines(driver):
    """The texts and gifts a tab shows, in order."""
    return [line for line in log_lines(driver) if line.startswith(NUMBERED)]


def phone_viewer(driver, link, ltb, tab_a, earlier):
    """Issue 23 in the page, tab C behind `link` (a phone's network): joining a room
    with history on shows its recent lines; a reset while lines are sent, then a
    reconnect, resumes with "since" and shows every line once; a reset right after a
    text reached the page but before its position notice did (the replay then holds
    that text again) shows it once too; a `skipped` notice shows inline. Returns
    whether the daemon numbers frames (positions in the history notice); without
    that, the reconnect reloads the recent lines instead, once each all the same."""
    def bob(text):
        ltb.send(TEXT, field(1, user_info("bob")) + field(2, text.encode()))

    driver.switch_to.new_window("tab")
    tab_c = driver.current_window_handle
    driver.get("http://127.0.0.1:%d/?room=%s" % (link.port, ROOM))
    wait(driver, "tab C connects on load", lambda d: state(d) == "open")
    join(driver, "dave")
    wait_line(driver, "tab C", earlier[-1])
    want = ["dave joined", "\u2014 the last %d messages \u2014" % len(earlier)] + earlier
    if log_lines(driver) != want:
        fail("tab C, joining after %d lines with history on, shows %r, not %r" % (len(earlier), log_lines(driver), want))
    join_dave = {"cmd": "nickname", "nickname": "dave", "room": ROOM, "positions": True}
    sent = [m for _, m in link.messages("sent")]
    if sent != [join_dave]:
        fail("tab C sent %r, not its join with positions %r" % (sent, join_dave))
    history = [m for _, m in link.messages("received") if m.get("code") == "history"]
    positions = bool(history) and "epoch" in history[0] and "seq" in history[0]
    if not positions:
        print("test-browser: this roomcastd sends no positions (no epoch in %r): the reconnects reload" % history)

    # The network goes away (a tunnel): the page closes, its reconnect waits in the
    # link's backlog while bob says five lines; then the link comes back.
    link.hold()
    link.cut()
    wait(driver, "tab C sees its connection reset", lambda d: reconnects(d) == 1)
    away = ["while away %d from bob" % i for i in range(1, 6)]
    for text in away:
        bob(text)
    driver.switch_to.window(tab_a)
    for text in away:
        wait_line(driver, "tab A", "bob: " + text)
    driver.switch_to.window(tab_c)
    link.release()
    wait(driver, "tab C reconnects", lambda d: state(d) == "open")
    wait_line(driver, "tab C", "bob: " + away[-1])
    bob("after the resume")
    wait_line(driver, "tab C", "bob: after the resume")
    want = earlier + ["bob: " + t for t in away] + ["bob: after the resume"]
    if numbered_lines(driver) != want:
        fail("tab C, after a reconnect, shows %r, not %r once each in order" % (numbered_lines(driver), want))
    if positions:
        joins = [m for _, m in link.messages("sent") if m.get("cmd") == "nickname"]
        since = joins[-1].get("since")
        if len(joins) != 2 or not since or since.get("epoch") != history[0]["epoch"]:
            fail("tab C's rejoin did not resume from the room's epoch %r: %r" % (history[0].get("epoch"), joins))
        lines = log_lines(driver)
        if "history lost: reloaded" in lines or want[0] not in lines or "dave joined" not in lines:
            fail("tab C's resume reloaded the view: %r" % lines)
        resumed = [m for n, m in link.messages("received") if n == link.websockets[-1] and m.get("code") == "history"]
        if [m.get("count") for m in resumed] != [len(away)]:
            fail("tab C's resume got the history notices %r, not one with count %d" % (resumed, len(away)))

    # A reset right after the text "race" reached the page, before the position
    # notice that follows it: the resume's replay holds "race" again.
    link.cut_after = lambda m: m.get("cmd") == "msg" and m.get("content") == "race"
    bob("race")
    wait(driver, "tab C reconnects after a reset between a text and its position",
         lambda d: reconnects(d) == 2 and state(d) == "open")
    bob("after the race")
    wait_line(driver, "tab C", "bob: after the race")
    want += ["bob: race", "bob: after the race"]
    if numbered_lines(driver) != want:
        fail("tab C, after a reset between a text and its position, shows %r, not %r once each in order"
             % (numbered_lines(driver), want))
    races = [n for n, m in link.messages("received") if m.get("cmd") == "msg" and m.get("content") == "race"]
    if positions and len(set(races)) != 2:
        fail("the daemon sent tab C \"race\" on WebSockets %r, not twice (live, then in the resume)" % races)

    # Shedding: a `skipped` notice (the daemon's, as the link inserts it) shows inline.
    link.inject({"cmd": "notice", "code": "skipped", "count": 7})
    wait_line(driver, "tab C", "7 messages skipped")
    if log_lines(driver)[-1] != "7 messages skipped":
        fail("tab C shows the skipped notice as %r, not last in the chat" % log_lines(driver)[-3:])
    driver.close()
    driver.switch_to.window(tab_a)
    wait_line(driver, "tab A", "dave left")
    return positions, len(races)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roomcastd", required=True)
    ap.add_argument("--web", required=True, help="the page's directory (web/)")
    ap.add_argument("--screenshot", help="the conversation, before any restart")
    ap.add_argument("--restart-screenshot", help="the conversation after the two restarts that kept it")
    ap.add_argument("--fdstore-max", type=int, default=16,
                    help="the fake PID 1's FileDescriptorStoreMax= (the shipped units': 16); 0 runs the daemon "
                         "without an fd store, where the restarts must fail the test")
    ap.add_argument("--crash", action="store_true",
                    help="also SIGKILL the daemon (Restart=on-failure) and require the tabs kept, as roomcastd "
                         "keeps WebSocket clients across a crash (docs/protocol/websocket.md section 15)")
    args = ap.parse_args()
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="roomcast-browser-")
    ltb_port, ws_port = free_port(), free_port()
    conf = os.path.join(work, "roomcastd.conf")
    with open(conf, "w") as f:
        # heartbeat.timeout = 0: the LTB client here sends no heartbeats. rooms.counts = 0:
        # no `viewers` notice every 5 s between the lines the test looks for. rooms.history
        # = 50, as `make run` has it (issue 23).
        f.write("[heartbeat]\ntimeout = 0\n[rooms]\ncounts = 0\nhistory = 50\n[websocket]\nlisten = 127.0.0.1:%d\npage = yes\npage_dir = %s\n"
                % (ws_port, os.path.abspath(args.web)))
    daemon_log = os.path.join(work, "roomcastd.log")
    # roomcastd under a fake PID 1 with an fd store, as the shipped standalone
    # unit runs it (its own listeners, kept in the store across restarts).
    service = FakeSystemd([os.path.abspath(args.roomcastd), "--config", conf, "--listen", "127.0.0.1:%d" % ltb_port],
                          work, daemon_log, fdstore_max=args.fdstore_max, deadline_s=DEADLINE_S)
    daemon = None
    driver = None
    try:
        try:
            service.start()
        except ServiceError as e:
            fail(str(e))
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
        driver.switch_to.window(tab_a)
        if args.screenshot:
            os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
            driver.save_screenshot(args.screenshot)

        # Issue 23: tab C, on a phone's network, joins after those lines with history on,
        # reconnects, resumes, and is told of skipped texts.
        link = PhoneLink(ws_port)
        earlier = ["alice: hello from a browser, ça va ?", "carol: hi alice <b>not bold</b>", "bob: hello browsers",
                   "bob sent 3 \u00d7 rose"]
        positions, races = phone_viewer(driver, link, ltb, tab_a, earlier)
        link.close()

        # Two restarts that keep everyone (docs/protocol/websocket.md section 15, "Restarts"):
        # the same WebSockets, no close, no new upgrade, no join again.
        gaps = [kept_restart(service, driver, (tab_a, tab_b), ltb, n) for n in (1, 2)]
        if args.crash:
            gaps.append(kept_restart(service, driver, (tab_a, tab_b), ltb, 3, crash=True))
        else:
            print("test-browser: no SIGKILL round (--crash not given)")
        driver.switch_to.window(tab_a)
        if args.restart_screenshot:
            os.makedirs(os.path.dirname(os.path.abspath(args.restart_screenshot)), exist_ok=True)
            driver.save_screenshot(args.restart_screenshot)

        # Tab B goes away: tab A and the LTB client see carol leave.
        driver.switch_to.window(tab_b)
        driver.close()
        driver.switch_to.window(tab_a)
        wait_line(driver, "tab A", "carol left")
        ltb.expect(LEAVE, "carol")

        # What tab A's WebSocket carried (DevTools): the JSON dialect, one object
        # a message; one WebSocket for the whole run, one join (the restarts
        # made it neither reconnect nor join again).
        by_tab = websocket_events(driver)
        join_alice = {"cmd": "nickname", "nickname": "alice", "room": ROOM, "positions": True}
        tab_events = [e for e in by_tab.values() if any(k == "sent" and json.loads(p) == join_alice for k, p in e)]
        if len(tab_events) != 1:
            fail("no single tab sent alice's join: %r" % by_tab)
        events = tab_events[0]
        created = [k for k, _ in events if k in ("created", "closed")]
        if created != ["created"]:
            fail("tab A's WebSockets were %r, not one created and none closed" % created)
        sent = [json.loads(p) for k, p in events if k == "sent"]
        received = [json.loads(p) for k, p in events if k == "received"]
        want_sent = [join_alice, {"cmd": "msg", "content": "hello from a browser, ça va ?"}]
        for n in range(1, len(gaps) + 1):
            want_sent += [{"cmd": "msg", "content": t} for t in
                          ["before restart %d from alice" % n] + ["during restart %d from alice (%d)" % (n, i) for i in (1, 2)]
                          + ["after restart %d from alice" % n]]
        if sent != want_sent:
            fail("tab A sent %r, not %r" % (sent, want_sent))
        for want in ({"cmd": "msg", "from": "bob", "content": "hello browsers"},
                     {"cmd": "gift", "from": "bob", "giftname": "rose", "giftURL": "https://example.com/rose.png", "giftcount": 3}):
            if want not in received:
                fail("tab A did not receive %r (received %r)" % (want, received))
        if not any(m.get("cmd") == "leave" and m.get("nickname") == "carol" for m in received):
            fail("tab A received no leave of carol: %r" % received)

        # A stop empties the fd store (systemctl stop): the page shows the
        # closed state. A daemon started without systemd serves the reconnect:
        # the page joins again; its stop closes with 1001 going away.
        ltb.sock.close()
        try:
            service.stop()
        except ServiceError as e:
            fail(str(e))
        wait(driver, "tab A shows the closed state after a stop", lambda d: state(d) == "closed")
        daemon = start_daemon(args.roomcastd, conf, ltb_port, daemon_log)
        ltb = LTBClient(ltb_port)
        ltb.send(JOIN, user_info("bob"))
        ltb.expect(JOIN, "bob")
        wait(driver, "tab A reconnects", lambda d: state(d) == "open")
        ltb.expect(JOIN, "alice")
        if positions:
            # A daemon without the hand-over: another epoch, the view is reloaded.
            wait_line(driver, "tab A", "history lost: reloaded")
            if numbered_lines(driver):
                fail("tab A kept the old daemon's lines after history_lost: %r" % log_lines(driver))
        if reconnects(driver) != 1:
            fail("tab A counted %d reconnects, not 1" % reconnects(driver))
        stop_daemon(daemon)
        daemon = None
        wait(driver, "tab A shows the closed state after the daemon's stop", lambda d: state(d) == "closed")
        closed = [line for line in log_lines(driver) if line.startswith("connection closed (")]
        if len(closed) != 2 or not closed[1].startswith("connection closed (1001"):
            fail("tab A did not show the 1001 close of a stop outside systemd: %r" % closed)
        print("test-browser: 2 tabs and 1 LTB client conversed in room %r; kept across 2 restarts%s (SIGTERM or SIGKILL "
              "to READY=1: %s ms, no reconnect); reconnect after a stop; a viewer joining later saw the %d recent lines, "
              "resumed after 2 resets (%s; \"race\" sent to it %d times, shown once) and showed a skipped notice; %.1f s"
              % (ROOM, " and a SIGKILL" if args.crash else "", ", ".join("%.0f" % g for g in gaps), len(earlier),
                 "with since" if positions else "reloaded: this roomcastd sends no positions", races,
                 time.monotonic() - start))
    finally:
        if driver is not None:
            driver.quit()
        if daemon is not None:
            stop_daemon(daemon)
        service.close()


if __name__ == "__main__":
    main()
