#!/usr/bin/env bash
# Instructions per delivered frame in roomcastd's fan-out path, counted by
# valgrind's callgrind (instruction counts do not depend on the machine's load,
# unlike times), plus the functions that spend them.
#
#   bench/profile.sh                       100 members, 1,000 and 5,000 frames
#   MEMBERS=1000 FRAMES_A=200 FRAMES_B=1000 bench/profile.sh
#
# Method: the release roomcastd runs under callgrind twice, each time for one
# closed-loop fan-out run of roomcast-bench (1 publisher, MEMBERS members,
# 64-byte opaque bodies, window 32) that sends FRAMES_A, then FRAMES_B frames,
# and is stopped with SIGTERM. Start-up, joins and shutdown are identical in
# both runs, so
#     instructions per delivery = (Ir_B - Ir_A) / ((FRAMES_B - FRAMES_A) * MEMBERS)
# counts the steady-state relay path only (read, parse, fan out, write).
# Heartbeat eviction is off (timeout = 0) and the generator sends no
# heartbeats, so nothing else differs between the runs.
# Also runs `perf stat -e instructions` when the machine exposes the counter
# (it does not in most VMs).
#
# Output: bench/results/profile-*.txt (summary + callgrind_annotate top
# functions) and the raw callgrind files in bench/results/callgrind/.
source "$(dirname "$0")/lib.sh"

MEMBERS=${MEMBERS:-100}
FRAMES_A=${FRAMES_A:-1000}
FRAMES_B=${FRAMES_B:-5000}
TOP=${TOP:-25}

ensure_valgrind
build
mkdir -p "$RESULTS/callgrind"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
PCONF=$LOGDIR/roomcastd-profile.conf
sed 's/^timeout = .*/timeout = 0/' "$CONF" >"$PCONF"

log "callgrind: $MEMBERS members x $FRAMES_A frames"
callgrind_run "$PCONF" "$FRAMES_A" "$RESULTS/callgrind/callgrind.$STAMP.$FRAMES_A.out" --members "$MEMBERS"; IR_A=$IR
log "callgrind: $MEMBERS members x $FRAMES_B frames"
callgrind_run "$PCONF" "$FRAMES_B" "$RESULTS/callgrind/callgrind.$STAMP.$FRAMES_B.out" --members "$MEMBERS"; IR_B=$IR; OUT_B=$OUTFILE

REPORT=$RESULTS/profile-$STAMP.txt
{
    echo "roomcastd fan-out profile, commit $(cd "$ROOT" && git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "workload: 1 publisher, $MEMBERS members, 64-byte opaque bodies, closed loop (window 32), echo off"
    echo "callgrind Ir: $FRAMES_A frames: $IR_A; $FRAMES_B frames: $IR_B"
    python3 -c "
a, b, fa, fb, m = $IR_A, $IR_B, $FRAMES_A, $FRAMES_B, $MEMBERS
d = (fb - fa) * m
print(f'instructions per delivered frame (steady state): {(b - a) / d:,.0f}  [(Ir_B - Ir_A) / {d:,} deliveries]')
print(f'instructions per delivered frame (whole run B, incl. start-up and joins): {b / (fb * m):,.0f}')
"
    echo
    for mode in no yes; do
        echo "top $TOP functions by $([ $mode = no ] && echo exclusive || echo inclusive) instructions, run B,"
        echo "with instructions per delivery (the function's count over run B's $((FRAMES_B * MEMBERS)) deliveries):"
        callgrind_annotate --inclusive=$mode --threshold=100 "$OUT_B" 2>/dev/null \
            | { if command -v swift >/dev/null; then swift demangle --simplified; else cat; fi; } \
            | python3 -c "
import re, sys
n = $FRAMES_B * $MEMBERS
rows = 0
for line in sys.stdin:
    m = re.match(r'\s*([0-9,]+) \(\s*([0-9.]+)%\)\s+(.*)', line)
    if not m or 'PROGRAM TOTALS' in line or rows >= $TOP:
        continue     # read on to the end: no SIGPIPE upstream
    ir = int(m.group(1).replace(',', ''))
    name = re.sub(r'\s*\[[^]]*\]\s*$', '', m.group(3))      # drop the object file
    name = re.sub(r'^(\./|\?\?\?:|//)', '', name)
    print(f'{ir / n:8.1f} {float(m.group(2)):6.2f}%  {name[:150]}')
    rows += 1
"
        echo
    done
} >"$REPORT"

# perf stat, where the PMU is exposed (not in most VMs: then it says so).
if command -v perf >/dev/null && perf stat -x, -e instructions -- true 2>&1 | grep -q '^[0-9]'; then
    log "perf stat: $MEMBERS members x $FRAMES_B frames"
    start_roomcastd
    perf stat -x, -e instructions -p "$ROOMCAST_PID" -o "$LOGDIR/perf.txt" &
    PERF=$!
    bench_run roomcast --members "$MEMBERS" --publishers 1 --size 64 --window 32 --frames "$FRAMES_B" --heartbeat 0 >"$LOGDIR/perf.json"
    kill -INT "$PERF"; wait "$PERF" || true
    stop_roomcastd
    python3 - "$LOGDIR/perf.txt" "$LOGDIR/perf.json" >>"$REPORT" <<'PY'
import json, sys
ins = next(int(l.split(",")[0]) for l in open(sys.argv[1]) if ",instructions" in l)
d = json.load(open(sys.argv[2]))
print(f"\nperf stat: {ins:,} instructions for {d['delivered']:,} deliveries (whole run incl. joins): {ins / d['delivered']:,.0f} per delivery")
PY
else
    echo >>"$REPORT"
    echo "perf stat -e instructions: not supported on this machine (no hardware counters exposed)" >>"$REPORT"
fi

# Syscalls per delivery (kernel work callgrind does not see), under strace -c:
# strace slows the daemon, which changes batching, so take it as an indication.
if [ "${STRACE:-1}" = 1 ] && command -v strace >/dev/null; then
    log "strace -c: $MEMBERS members x $FRAMES_B frames"
    port_free "$ROOMCAST_PORT" || { log "port $ROOMCAST_PORT is busy"; exit 1; }
    taskset -c "$SERVER_CPU" strace -f -c -o "$LOGDIR/strace.txt" \
        "$BIN/roomcastd" --config "$PCONF" --listen "127.0.0.1:$ROOMCAST_PORT" >"$LOGDIR/strace.log" 2>&1 &
    ROOMCAST_PID=$!
    wait_listening "$ROOMCAST_PORT" "$ROOMCAST_PID" roomcastd
    timeout 600 taskset -c "$GEN_CPU" "$BIN/roomcast-bench" --port "$ROOMCAST_PORT" --members "$MEMBERS" \
        --publishers 1 --size 64 --window 32 --frames "$FRAMES_B" --heartbeat 0 --drain 30 --json >"$LOGDIR/strace.json"
    # SIGTERM to the daemon (strace's child), so that strace sees it exit and writes its summary.
    kill -TERM "$(pgrep -P "$ROOMCAST_PID" | head -1)" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$ROOMCAST_PID" 2>/dev/null || break; sleep 0.1; done
    stop_roomcastd
    python3 - "$LOGDIR/strace.txt" "$LOGDIR/strace.json" >>"$REPORT" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
n = d["delivered"]
print(f"\nsyscalls under strace -c, whole run, {n:,} data deliveries (start-up and joins included):")
rows = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[3].isdigit():
        rows.append((int(f[3]), f[-1]))
total = [r for r in rows if r[1] == "total"]
rows = sorted((r for r in rows if r[1] != "total"), reverse=True)[:10] + total
for calls, name in rows:
    print(f"  {name:14} {calls:>10,}  {calls / n:8.4f} per delivery")
PY
fi

cp "$REPORT" "$RESULTS/profile-latest.txt"
cat "$REPORT"
