#!/usr/bin/env bash
# make bench-history: what recent lines on join cost the fan-out (issue 23's
# bench row, target "fan-out with history on (1,000 members) within 5 % of
# it off"). Each round runs the release roomcastd twice, each time fresh and
# for one `fanout` run of roomcast-bench (1 publisher, 1,000 members, 64-byte
# text bodies, ChatMessage type 2, closed loop, window 64): once with the
# bench config plus `[rooms] history = HISTORY` (50), once with `history = 0`
# (off). The order turns every round (on/off, off/on, ...), so a drift in the
# shared machine's load favours neither; the figure is the median over the
# rounds of the ratio on / off within each round (the two runs of a ratio
# shared the machine's load), of deliveries/s and of deliveries per server
# CPU-second.
#
# Every run checks that the setting took effect: 3.5 s into it a probe client
# joins the room and must get the notice `history` with count HISTORY and
# then HISTORY text frames (with history on), or no `history` notice before
# the first live text frame (off).
#
# Then, unless PROFILE=0, callgrind's instructions per delivery with history
# on and off (bench/lib.sh's callgrind_run, as make bench-profile, with text
# bodies: history keeps only text and gift frames), for each room size of
# PROFILE_MEMBERS: (Ir(FRAMES_B) - Ir(FRAMES_A)) / ((FRAMES_B - FRAMES_A) x members),
# and what history adds per frame relayed (the difference x members).
#
#   bench/history.sh                            16 rounds of 5 s runs, then callgrind at 1,000 and 100 members
#   BENCH_ROUNDS=8 SECONDS_EACH=10 bench/history.sh
#   PROFILE=0 bench/history.sh                  the timed rounds only
#
# Output: bench/results/history-DATE.jsonl (a machine line, one JSON line per
# run with the probe's findings, the callgrind counts), history-DATE.md (the
# table) and history-latest.md (a copy of it).
source "$(dirname "$0")/lib.sh"

ROUNDS=${BENCH_ROUNDS:-16}
SECONDS_EACH=${SECONDS_EACH:-5}
HISTORY=${HISTORY:-50}
PROFILE=${PROFILE:-1}
PROFILE_MEMBERS=${PROFILE_MEMBERS:-1000 100}
FRAMES_A=${FRAMES_A:-200}
FRAMES_B=${FRAMES_B:-1000}
# The probe joins this long after the generator started: after its set-up
# (1,000 connects and joins, 0.3-1 s here) and warm-up (1 s), so that the
# room's history is full, and well before the 5 s window ends.
PROBE_AFTER=${PROBE_AFTER:-3.5}

[ "$ROUNDS" -ge 1 ] || { log "BENCH_ROUNDS must be at least 1"; exit 64; }
[ "$HISTORY" -ge 1 ] || { log "HISTORY must be at least 1 (the on runs)"; exit 64; }
build
mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$RESULTS/history-$STAMP.jsonl
MD=$RESULTS/history-$STAMP.md
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
machine_json >"$OUT"

# The bench config has no [rooms] section: each run's config adds one.
conf_for() { # on|off: writes the run's config, prints its path
    local c=$LOGDIR/roomcastd-history-$1.conf
    { cat "$CONF"; printf '\n[rooms]\nhistory = %s\n' "$([ "$1" = on ] && echo "$HISTORY" || echo 0)"; } >"$c"
    echo "$c"
}
CONF_ON=$(conf_for on)
CONF_OFF=$(conf_for off)

# probe: one LTB client joins room "bench" and reports, as JSON, the count
# of the first `history` notice it gets and how many text frames follow it
# before anything else, or null when a live text frame comes first (bounded:
# 3 s). Little-endian LTB, as the bench config.
probe() {
    timeout 10 python3 - "$ROOMCAST_PORT" "$ROOT/systemd" <<'PY'
import json, socket, struct, sys, time
sys.path.insert(0, sys.argv[2])
from chatpool import field, fields  # the proto2 helpers the systemd suite uses

user = field(1, 1) + field(2, b"history-probe") + field(3, b"") + field(4, b"bench")
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(struct.pack("<IH", len(user), 0) + user)
buf, count, frames, deadline = b"", None, 0, time.monotonic() + 3
result = None
while result is None and time.monotonic() < deadline:
    try:
        chunk = s.recv(65536)
    except TimeoutError:
        break
    if not chunk:
        break
    buf += chunk
    while len(buf) >= 6 and result is None:
        length, type_ = struct.unpack_from("<IH", buf)
        if len(buf) < 6 + length:
            break
        body, buf = buf[6:6 + length], buf[6 + length:]
        if type_ == 9:
            f = fields(body)
            if f.get(1) == b"history":
                if count is not None:
                    result = {"history_notice": count, "history_frames": frames, "ended_by": "second history notice"}
                count, frames = f.get(4, 0), 0
            continue   # viewers and other notices: not ours
        if type_ == 2:
            if count is None:
                result = {"history_notice": None, "history_frames": 0, "ended_by": "live text first"}
            elif frames < count:
                frames += 1
            else:
                result = {"history_notice": count, "history_frames": frames, "ended_by": "live text"}
        # joins (type 0) and leaves of other members: skipped
s.close()
print(json.dumps(result or {"history_notice": count, "history_frames": frames, "ended_by": "timeout"}))
PY
}

# timed_run on|off ROUND: a fresh daemon, one fanout run and the probe;
# appends the run's JSON line, with the probe's findings, to $OUT.
timed_run() {
    local kind=$1 round=$2 conf
    conf=$([ "$kind" = on ] && echo "$CONF_ON" || echo "$CONF_OFF")
    log "history $kind (round $round of $ROUNDS)"
    start_roomcastd "$conf"
    bench_run roomcast --mode fanout --label "history-$kind" --duration "$SECONDS_EACH" >"$LOGDIR/run.json" &
    local gen=$!
    sleep "$PROBE_AFTER"
    probe >"$LOGDIR/probe.json" || echo '{"history_notice": "probe failed"}' >"$LOGDIR/probe.json"
    wait "$gen" || true
    stop_roomcastd
    python3 - "$LOGDIR/run.json" "$LOGDIR/probe.json" "$kind" "$round" "$([ "$kind" = on ] && echo "$HISTORY" || echo 0)" >>"$OUT" <<'PY'
import json, sys
run_file, probe_file, kind, rnd, history = sys.argv[1:]
try:
    run = json.loads(open(run_file).read())
except ValueError:
    sys.exit(f"history {kind}, round {rnd}: roomcast-bench wrote no result")
run.update(round=int(rnd), history=int(history), probe=json.loads(open(probe_file).read()))
print(json.dumps(run))
PY
}

for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order=(on off); else order=(off on); fi
    for kind in "${order[@]}"; do timed_run "$kind" "$round"; done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

if [ "$PROFILE" = 1 ]; then
    ensure_valgrind
    mkdir -p "$RESULTS/callgrind"
    for kind in off on; do
        c=$LOGDIR/roomcastd-history-$kind-profile.conf
        sed 's/^timeout = .*/timeout = 0/' "$([ "$kind" = on ] && echo "$CONF_ON" || echo "$CONF_OFF")" >"$c"
    done
    for members in $PROFILE_MEMBERS; do
        for kind in off on; do
            for frames in "$FRAMES_A" "$FRAMES_B"; do
                log "callgrind: history $kind, $members members x $frames frames"
                callgrind_run "$LOGDIR/roomcastd-history-$kind-profile.conf" "$frames" \
                    "$RESULTS/callgrind/callgrind.history-$STAMP.$kind.$members.$frames.out" --members "$members" --body text
                # The instructions of RoomHistory.append and what it calls (the
                # frame's copy, trimming, malloc and free): the history's own
                # cost, which does not move with the batching of a pass.
                append=$(callgrind_annotate --inclusive=yes --threshold=100 "$OUTFILE" 2>/dev/null \
                    | { if command -v swift >/dev/null; then swift demangle --simplified; else cat; fi; } \
                    | sed -n 's/^ *\([0-9,]*\) (.*RoomHistory\(\.\|V6\)append.*/\1/p' | head -1 | tr -d ,)
                printf '{"callgrind": true, "history": %s, "members": %s, "frames": %s, "ir": %s, "history_append_ir": %s}\n' \
                    "$([ "$kind" = on ] && echo "$HISTORY" || echo 0)" "$members" "$frames" "$IR" "${append:-0}" >>"$OUT"
            done
        done
    done
fi

python3 - "$OUT" "$MD" "$HISTORY" "$SECONDS_EACH" "$LOAD_BEFORE" "$LOAD_AFTER" "$FRAMES_A" "$FRAMES_B" <<'PY'
import json, statistics, sys
out, md, history, seconds, load_before, load_after, fa, fb = sys.argv[1:]
history, fa, fb = int(history), int(fa), int(fb)
rows = [json.loads(l) for l in open(out) if l.strip()]
machine = next(r for r in rows if r.get("machine"))
runs = [r for r in rows if "round" in r]
grind = [r for r in rows if r.get("callgrind")]
lines = []
p = lines.append

def probe_ok(r):
    pr = r.get("probe") or {}
    if r["history"] > 0:
        return pr.get("history_notice") == r["history"] and pr.get("history_frames") == r["history"]
    return pr.get("history_notice") is None and pr.get("ended_by") == "live text first"

def probe_text(r):
    pr = r.get("probe") or {}
    if pr.get("history_notice") is None:
        return "no history notice" + (" (ok)" if probe_ok(r) else f" ({pr.get('ended_by')}: NOT as configured)")
    return f"history {pr['history_notice']}, {pr.get('history_frames')} frames" + (" (ok)" if probe_ok(r) else " (NOT as configured)")

p(f"## History on ({history}) against off: fan-out, 1,000 members (make bench-history)")
p("")
p(f"{machine['date']}, commit {machine['commit']}, {machine['nproc']} cores ({machine['cpu']}, shared with other "
  f"engineers' builds and tests), load average {load_before} before, {load_after} after the timed rounds. "
  f"One fresh roomcastd (core 0) per run, roomcast-bench (core 1) `--mode fanout`: 1 publisher, 1,000 members, "
  f"64-byte text bodies, closed loop (window 64), {seconds} s measured per run; on/off alternating, "
  f"the order turned every round.")
p("")
p("| round | order | deliveries/s off | deliveries/s on | on / off | per server CPU-s off | per server CPU-s on | on / off | "
  "server CPU % off / on (waiting %) | generator CPU % off / on | probe off | probe on |")
p("|---|---|---|---|---|---|---|---|---|---|---|---|")
ratios, cpu_ratios = [], []
for rnd in sorted({r["round"] for r in runs}):
    pair = {("on" if r["history"] else "off"): r for r in runs if r["round"] == rnd}
    if set(pair) != {"on", "off"}:
        p(f"| {rnd} | incomplete | | | | | | | | | | |")
        continue
    on, off = pair["on"], pair["off"]
    order = "on, off" if rnd % 2 else "off, on"
    ratio = on["deliveries_per_s"] / off["deliveries_per_s"]
    cpu = on["deliveries_per_server_cpu_s"] / off["deliveries_per_server_cpu_s"]
    ratios.append(ratio); cpu_ratios.append(cpu)
    p(f"| {rnd} | {order} | {off['deliveries_per_s']:,} | {on['deliveries_per_s']:,} | {ratio:.3f}x | "
      f"{off['deliveries_per_server_cpu_s']:,} | {on['deliveries_per_server_cpu_s']:,} | {cpu:.3f}x | "
      f"{off['server_cpu_pct']:.0f} / {on['server_cpu_pct']:.0f} ({off['server_wait_pct']:.0f} / {on['server_wait_pct']:.0f}) | "
      f"{off['gen_cpu_pct']:.0f} / {on['gen_cpu_pct']:.0f} | {probe_text(off)} | {probe_text(on)} |")
p("")
med = lambda v: statistics.median(v) if v else float("nan")
def med_of(kind, key):
    return med([r[key] for r in runs if bool(r["history"]) == (kind == "on")])
ok = bool(ratios) and med(ratios) >= 0.95
problems = []
lost = sum(r.get("loss", 0) for r in runs); order_errors = sum(r.get("order_errors", 0) for r in runs)
cut = sum(r.get("closed_by_server", 0) for r in runs)
if lost or order_errors or cut:
    problems.append(f"{lost} lost, {order_errors} out of order, {cut} connections closed by the server")
if not all(probe_ok(r) for r in runs):
    problems.append("a probe found the history setting not in effect (see the probe columns)")
if any(r.get("gen_bound") for r in runs):
    problems.append("the generator was at 90 % of its core or more in some run (the figure may be the generator's)")
p(f"**history = {history} / history = 0, median of {len(ratios)} rounds: {med(ratios):.3f}x deliveries/s "
  f"(rounds {', '.join(f'{x:.3f}' for x in ratios)}; target >= 0.95x: {'met' if ok else 'NOT met'}), "
  f"{med(cpu_ratios):.3f}x deliveries per server CPU-second.** "
  f"Medians of the runs: off {med_of('off', 'deliveries_per_s'):,.0f}, on {med_of('on', 'deliveries_per_s'):,.0f} deliveries/s; "
  f"p99 latency off {med_of('off', 'lat_p99_us') / 1000:.1f} ms, on {med_of('on', 'lat_p99_us') / 1000:.1f} ms.")
p("")
p("Problems: " + ("; ".join(problems) if problems else "none (0 lost, 0 out of order, 0 closed by the server, every probe as configured)."))
p("")
p("Probe: 3.5 s into each run a client joins the room: with history on it must get the notice `history` with count "
  f"{history} and {history} text frames, with it off a live text frame and no `history` notice. Server CPU: % of a core "
  "over the window; waiting: % of the window the daemon was runnable while another process had its core.")
if grind:
    p("")
    p(f"### callgrind: instructions per delivery (release roomcastd, 1 publisher, 64-byte text bodies, window 32; "
      f"(Ir({fb:,} frames) - Ir({fa:,} frames)) / ({fb - fa:,} x members))")
    p("")
    p("| members | history off | history on | on - off per delivery | on - off per frame relayed | RoomHistory.append per frame (inclusive) | that per delivery |")
    p("|---|---|---|---|---|---|---|")
    for m in sorted({g["members"] for g in grind}, reverse=True):
        ipd = {}
        app = {g["frames"]: g.get("history_append_ir", 0) for g in grind if g["members"] == m and g["history"]}
        per_frame = (app[fb] - app[fa]) / (fb - fa) if fa in app and fb in app and app[fb] else None
        for kind in ("off", "on"):
            ir = {g["frames"]: g["ir"] for g in grind if g["members"] == m and bool(g["history"]) == (kind == "on")}
            if fa in ir and fb in ir:
                ipd[kind] = (ir[fb] - ir[fa]) / ((fb - fa) * m)
        if len(ipd) == 2:
            d = ipd["on"] - ipd["off"]
            pf = f"{per_frame:,.0f} | {per_frame / m:.2f} ({per_frame / m / ipd['off'] * 100:.1f} % of off)" if per_frame else "- | -"
            p(f"| {m:,} | {ipd['off']:.1f} | {ipd['on']:.1f} | {d:+.1f} ({d / ipd['off'] * 100:+.1f} %) | {d * m:+,.0f} | {pf} |")
    p("")
    p("The on - off difference moves with how frames batch per loop pass (the generator runs beside callgrind's slowed "
      "daemon), by several instructions per delivery between runs at 1,000 members; RoomHistory.append's inclusive count "
      "(the frame's copy, trimming, malloc and free; the difference of the two on runs over their frames) does not.")
text = "\n".join(lines) + "\n"
open(md, "w").write(text)
print(text)
PY
cp "$MD" "$RESULTS/history-latest.md"
log "raw results: $OUT; table: $MD (and history-latest.md)"
