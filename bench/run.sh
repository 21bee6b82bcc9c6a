#!/usr/bin/env bash
# make bench: every workload of BENCHMARKS.md against a release roomcastd,
# the C relay bench/ltb-relay.c (the practical limit: BENCHMARKS.md) and,
# when redis-server is (or can be) installed, Redis pub/sub, in one run.
# Prints one table with the three servers and both ratios (roomcastd / C
# relay, roomcastd / Redis); keeps the raw JSON lines in
# bench/results/latest.jsonl and the table in bench/results/latest.md.
#
#   bench/run.sh                 all workloads, three repetitions, medians (about 15 minutes plus the build)
#   bench/run.sh fanout large    only those (idle fanout pub10 large latency storm verify)
#   BENCH_REPEAT=1 bench/run.sh  one repetition
#   BENCH_QUICK=1 bench/run.sh   shorter runs and one repetition (unless BENCH_REPEAT says otherwise)
#
# roomcastd runs at its default output limits (the C relay and Redis are more
# generous: bench/lib.sh), and `large` runs with echo: its publisher reads its own 16 KiB frames back as
# they come while keeping 64 in flight, as the independent generator's does.
# A client cut there fails the row's target (bench/table.py).
source "$(dirname "$0")/lib.sh"

WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(idle fanout pub10 large latency storm verify)
# `verify` is no server workload: what one signed join's token costs the daemon
# to verify (roomcast-bench verify-tokens), appended to the table.
VERIFY=no
if [[ " ${WORKLOADS[*]} " == *" verify "* ]]; then
    VERIFY=yes
    rest=(); for w in "${WORKLOADS[@]}"; do [ "$w" = verify ] || rest+=("$w"); done
    WORKLOADS=("${rest[@]}")
fi
# Idle goes first, while the servers are fresh: their RSS then is the baseline.
if [[ " ${WORKLOADS[*]} " == *" idle "* ]]; then
    rest=(); for w in "${WORKLOADS[@]}"; do [ "$w" = idle ] || rest+=("$w"); done
    WORKLOADS=(idle "${rest[@]}")
fi
for w in "${WORKLOADS[@]}"; do
    case $w in idle|fanout|pub10|large|latency|storm) ;; *) log "unknown workload $w"; exit 64 ;; esac
done
if [ "${BENCH_QUICK:-}" = 1 ]; then
    DUR=(--duration 3); IDLE=(--connections 5000 --rss-steps 1000 --duration 10)
    REPEAT=${BENCH_REPEAT:-1}
else
    DUR=(); IDLE=()
    REPEAT=${BENCH_REPEAT:-3}
fi

build
# The yardstick must relay every frame, in order, before it measures anything.
python3 "$ROOT/bench/check-relay.py" "$BENCH_BUILD/ltb-relay" >&2 || { log "the C relay failed its check"; exit 1; }
mkdir -p "$RESULTS"
OUT=$RESULTS/run-$(date -u +%Y%m%dT%H%M%SZ).jsonl
machine_json >"$OUT"

SERVERS=(roomcast roomcast-ws relay)
if ensure_redis; then SERVERS+=(redis); else log "redis-server not available: roomcastd and the C relay only"; fi

# The C relay has no rooms: it relays every frame to every client. It runs
# only where the workload is one room, so that this is the same relay.
relay_runs() { case $1 in fanout|pub10|large|latency) return 0 ;; *) return 1 ;; esac; }
# The WebSocket members (roomcast-ws: the same daemon, members on its WebSocket
# listener) run the fan-out workloads, 64 B and 16 KiB, beside its LTB members.
ws_runs() { case $1 in fanout|large) return 0 ;; *) return 1 ;; esac; }

# `large` runs with echo on: roomcastd with a copy of the bench config that
# says `echo = yes`, the C relay with --echo (everyone gets the whole batch),
# the generator with --echo yes (Redis has no echo: its publishers do not
# subscribe). So the publisher is also a reader of 16 KiB frames.
ECHO_CONF=$LOGDIR/roomcastd-bench-echo.conf
sed 's/^echo = no$/echo = yes/' "$CONF" >"$ECHO_CONF"
echo_runs() { [ "$1" = large ]; }
# servers_echo yes|no: roomcastd and the C relay restarted with echo on or off.
servers_echo() {
    stop_roomcastd
    stop_relay
    if [ "$1" = yes ]; then start_roomcastd "$ECHO_CONF"; start_relay --echo; else start_roomcastd; start_relay; fi
}

[ ${#WORKLOADS[@]} -gt 0 ] || REPEAT=0
for rep in $(seq "$REPEAT"); do
    # Fresh servers for every repetition (the idle workload's RSS baseline).
    start_roomcastd
    start_relay
    [[ " ${SERVERS[*]} " == *" redis "* ]] && start_redis
    # The order of the servers turns with each repetition, so a drift in the
    # machine's load does not always favour the same one.
    order=()
    for i in "${!SERVERS[@]}"; do order+=("${SERVERS[$(((i + rep - 1) % ${#SERVERS[@]}))]}"); done
    for w in "${WORKLOADS[@]}"; do
        echo_runs "$w" && servers_echo yes
        for s in "${order[@]}"; do
            [ "$s" = relay ] && ! relay_runs "$w" && continue
            [ "$s" = roomcast-ws ] && ! ws_runs "$w" && continue
            log "$w: $s (repetition $rep of $REPEAT)"
            echo=(); echo_runs "$w" && [ "$s" != redis ] && echo=(--echo yes)
            case $w in
                idle) bench_run "$s" --mode idle --label "rep-$rep" "${IDLE[@]}" >>"$OUT" ;;
                storm) bench_run "$s" --mode storm --label "rep-$rep" >>"$OUT" ;;
                *) bench_run "$s" --mode "$w" --label "rep-$rep" "${DUR[@]}" "${echo[@]}" >>"$OUT" ;;
            esac
        done
        echo_runs "$w" && servers_echo no
    done
    stop_roomcastd
    stop_relay
    stop_redis
done

if [ ${#WORKLOADS[@]} -gt 0 ]; then
    cp "$OUT" "$RESULTS/latest.jsonl"
    python3 "$ROOT/bench/table.py" "$OUT" --markdown "$RESULTS/latest.md"
    log "raw results: $OUT"
fi
# Its table goes to verify-latest.md, and below the servers' table when they ran too.
if [ "$VERIFY" = yes ]; then
    log "verify: the cost of one signed join's token (HS256, EdDSA)"
    verify=$("$BENCH_BUILD/release/roomcast-bench" verify-tokens)
    echo "$verify"
    printf '## Signed joins: verifying one token (roomcast-bench verify-tokens, one core; %s cores, load average %s)\n\n```\n%s\n```\n' \
        "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$verify" >"$RESULTS/verify-latest.md"
    [ ${#WORKLOADS[@]} -eq 0 ] || { echo; cat "$RESULTS/verify-latest.md"; } >>"$RESULTS/latest.md"
fi
