#!/usr/bin/env bash
# make bench-publish: publishes per second through the backend API
# (docs/api.md, POST /v1/rooms/bench/publish) into a room of 1,000 members
# over 1 and 4 keep-alive connections and into 50 members, beside the LTB
# fan-out of the same daemon in the same run (one LTB publisher, closed loop,
# into the same members), so the API's cost shows as a ratio: against
# `make bench`'s window of 64 frames outstanding, and against windows of 1
# and 4, the same number of publishes under way as 1 and 4 API connections
# (the daemon writes each member once per loop turn, so what one turn
# carries, not the API, sets the cost of a publish); and the 1,000-member,
# 1-connection row again with an Idempotency-Key on every publish (its cost). One roomcastd (pinned to core 0) for every row; the
# members and the API connections are roomcast-bench's own, on its one epoll
# loop (pinned to core 1), which drains 1,000 members at full speed: its CPU
# is in the table, so a generator-bound row shows.
#
# Every API row checks itself: each publish reaches every member once, in
# order (sequence numbers in the text: "lost" and "order" must be 0), every
# answer's {"delivered": N} is the member count, and the daemon's own count
# (GET /metrics, roomcast_frames_delivered_total{type="text"}) over the run
# equals what the members received.
#
#   bench/publish.sh                          3 repetitions of 11 rows, 5 s each (about 6 minutes plus the build)
#   BENCH_REPEAT=1 SECONDS_EACH=10 bench/publish.sh
#
# Output: the table on stdout and in bench/results/publish-DATE.txt, the raw
# JSON lines in bench/results/publish-DATE.jsonl.
source "$(dirname "$0")/lib.sh"

REPEAT=${BENCH_REPEAT:-3}
SECONDS_EACH=${SECONDS_EACH:-5}
API_PORT=${API_PORT:-$((ROOMCAST_PORT + 3))}

build
mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%MZ)
OUT=$RESULTS/publish-$STAMP.jsonl
TXT=$RESULTS/publish-$STAMP.txt
: >"$OUT"
port_free "$API_PORT" || { log "port $API_PORT is busy (set API_PORT)"; exit 1; }

# A throwaway key (api.key_file: mode 600, one key a line), never printed.
KEYS=$LOGDIR/api.keys
(umask 077 && printf 'bench-%s\n' "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" >"$KEYS")
PCONF=$LOGDIR/roomcastd-bench-api.conf
{ cat "$CONF"; printf '\n[api]\nlisten = 127.0.0.1:%s\nkey_file = %s\n' "$API_PORT" "$KEYS"; } >"$PCONF"

LOAD_BEFORE=$(uptime)
machine_json >>"$OUT"
start_roomcastd "$PCONF"
wait_listening "$API_PORT" "$ROOMCAST_PID" roomcastd

# row LABEL ARGS...: one roomcast-bench run against the daemon, its JSON line into $OUT.
row() {
    local label=$1; shift
    log "$label (repetition $rep of $REPEAT)"
    bench_run roomcast --json --label "$label" --duration "$SECONDS_EACH" "$@" >>"$OUT"
}
api=(--mode publish --api-port "$API_PORT" --api-key-file "$KEYS")
for rep in $(seq "$REPEAT"); do
    # The order turns with each repetition, so a drift in load favours no row.
    rows=(ltb-1000 ltb-1000-w1 ltb-1000-w4 api-1000x1 api-1000x4 api-1000x1-idem ltb-50 ltb-50-w1 ltb-50-w4 api-50x1 api-50x4)
    [ $((rep % 2)) = 0 ] && rows=($(printf '%s\n' "${rows[@]}" | tac))
    for r in "${rows[@]}"; do
        case $r in
            ltb-1000) row "$r" --mode fanout --members 1000 ;;
            ltb-1000-w1) row "$r" --mode fanout --members 1000 --window 1 ;;
            ltb-1000-w4) row "$r" --mode fanout --members 1000 --window 4 ;;
            ltb-50) row "$r" --mode fanout --members 50 ;;
            ltb-50-w1) row "$r" --mode fanout --members 50 --window 1 ;;
            ltb-50-w4) row "$r" --mode fanout --members 50 --window 4 ;;
            api-1000x1) row "$r" "${api[@]}" --members 1000 --publishers 1 ;;
            api-1000x4) row "$r" "${api[@]}" --members 1000 --publishers 4 ;;
            api-50x1) row "$r" "${api[@]}" --members 50 --publishers 1 ;;
            api-50x4) row "$r" "${api[@]}" --members 50 --publishers 4 ;;
            api-1000x1-idem) row "$r" "${api[@]}" --members 1000 --publishers 1 --idempotency ;;
        esac
    done
done
stop_roomcastd
LOAD_AFTER=$(uptime)

{
    echo "make bench-publish ($(date -u +%Y-%m-%dT%H:%MZ), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
    echo "load before:$LOAD_BEFORE"
    echo "load after: $LOAD_AFTER"
    echo "one roomcastd (core $SERVER_CPU), roomcast-bench (core $GEN_CPU); 64-byte text bodies; median of $REPEAT runs of ${SECONDS_EACH} s each"
    echo
    python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for r in rows:
    if "label" in r:
        runs.setdefault(r["label"], []).append(r)
def med(label, key):
    v = [r[key] for r in runs.get(label, []) if r.get(key) is not None]
    return statistics.median(v) if v else None
def total(label, key):
    return sum(r.get(key, 0) or 0 for r in runs.get(label, []))
def rate(label):
    # Publishes/s: answered API publishes, or LTB frames relayed to every member.
    if label.startswith("api"):
        return med(label, "publishes_per_s")
    v = [r["deliveries_per_s"] / r["members"] for r in runs.get(label, [])]
    return statistics.median(v) if v else None
def f(v, digits=0):
    return "-" if v is None else f"{v:,.{digits}f}"
print("| row | publisher | members | publishes/s | vs LTB window 64 | vs LTB, same under way | request p50 / p99 (us) | deliveries/s (members) | deliveries/s (/metrics) | deliveries per server CPU-s | lost | order errors | answers not 200 | /metrics = members | server CPU (waiting) | generator CPU | runs |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for label in ["ltb-1000", "ltb-1000-w1", "ltb-1000-w4", "api-1000x1", "api-1000x4", "api-1000x1-idem",
              "ltb-50", "ltb-50-w1", "ltb-50-w4", "api-50x1", "api-50x4"]:
    rs = runs.get(label, [])
    if not rs:
        continue
    members = rs[0]["members"]
    api = label.startswith("api")
    ltb = rate(f"ltb-{members}")
    n = rs[0].get("api_connections", 0)
    same = rate(f"ltb-{members}-w{n}") if api else None
    window = label.split("-w")[1] if "-w" in label else "64"
    who = (f"{n} API connection" + ("s" if n > 1 else "")
           + (", Idempotency-Key" if rs[0].get("idempotency") else "")) if api else f"1 LTB client, window {window}"
    ratio = f"{rate(label) / ltb:.3f}x" if ltb and rate(label) is not None else "-"
    ratio_same = f"{rate(label) / same:.2f}x" if api and same else "-"
    lat = f"{f(med(label, 'req_p50_us'))} / {f(med(label, 'req_p99_us'))}" if api else "-"
    match = ("yes" if all(r.get("daemon_match") for r in rs) else "NO") if api else "-"
    print(f"| {label} | {who} | {members:,} | {f(rate(label))} | {ratio} | {ratio_same} | {lat} | {f(med(label, 'deliveries_per_s'))} | "
          f"{f(med(label, 'daemon_deliveries_per_s')) if api else '-'} | {f(med(label, 'deliveries_per_server_cpu_s'))} | "
          f"{total(label, 'loss')} | {total(label, 'order_errors')} | "
          f"{total(label, 'api_errors') + total(label, 'delivered_mismatch') if api else '-'} | {match} | "
          f"{f(med(label, 'server_cpu_pct'))} % ({f(med(label, 'server_wait_pct'))} %) | {f(med(label, 'gen_cpu_pct'))} % | {len(rs)} |")
cut = sum(r.get("closed_by_server", 0) for r in rows)
problems = sorted({r["first_problem"] for r in rows if r.get("first_problem")})
print()
print(f"connections closed by the server: {cut}" + ("; problems: " + "; ".join(problems) if problems else ""))
print("publishes/s of an LTB row: frames each member received per second. server CPU: % of a core over the window;"
      " (waiting): % of the window the daemon was runnable but another process had its core.")
PY
} | tee "$TXT"
log "raw results: $OUT"
