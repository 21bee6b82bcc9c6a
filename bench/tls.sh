#!/usr/bin/env bash
# make bench-tls: the TLS rows of BENCHMARKS.md, one roomcastd, in one run:
# fan-out (1 publisher, 1,000 members, 64-byte bodies, closed loop) on the
# plain LTB listener and on a listen_tls one (TLS 1.3, a P-256 certificate
# made here), then RSS per idle connection (plain, then TLS: each on a fresh
# daemon). Targets (docs/operations/network.md "TLS"): TLS fan-out at least 0.5x
# plain deliveries/s, under 20 KiB per idle TLS connection.
#
#   bench/tls.sh                 3 repetitions of each fan-out, idle 5,000 connections
#   BENCH_REPEAT=1 IDLE_CONNECTIONS=2000 bench/tls.sh
#
# Output: bench/results/tls-*.jsonl and a summary on stdout.
source "$(dirname "$0")/lib.sh"

REPEAT=${BENCH_REPEAT:-3}
IDLE_CONNECTIONS=${IDLE_CONNECTIONS:-5000}
TLS_PORT=${TLS_PORT:-$((ROOMCAST_PORT + 2))}

build
mkdir -p "$RESULTS"
OUT=$RESULTS/tls-$(date -u +%Y%m%dT%H%M%SZ).jsonl
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$LOGDIR/tls-key.pem" \
    -out "$LOGDIR/tls-cert.pem" -days 1 -subj /CN=localhost 2>/dev/null
TCONF=$LOGDIR/roomcastd-bench-tls.conf
sed "s|^listen = .*|&\nlisten_tls = 127.0.0.1:$TLS_PORT|" "$CONF" >"$TCONF"
printf '\n[tls]\ncert_file = %s\nkey_file = %s\n' "$LOGDIR/tls-cert.pem" "$LOGDIR/tls-key.pem" >>"$TCONF"

# tls_run PORT LABEL ARGS...: one roomcast-bench run against the daemon (bounded: 5 minutes).
tls_run() {
    local port=$1 label=$2; shift 2
    timeout 300 taskset -c "$GEN_CPU" "$BIN/roomcast-bench" --target roomcast --server roomcast --port "$port" \
        --server-pid "$ROOMCAST_PID" --json --label "$label" "$@" >>"$OUT" || log "roomcast-bench $label failed"
}

for rep in $(seq "$REPEAT"); do
    start_roomcastd "$TCONF"
    # The order turns with each repetition, so a drift in load favours neither.
    if [ $((rep % 2)) = 1 ]; then order=(plain tls); else order=(tls plain); fi
    for kind in "${order[@]}"; do
        log "fanout: $kind (repetition $rep of $REPEAT)"
        if [ "$kind" = plain ]; then tls_run "$ROOMCAST_PORT" fanout-plain --mode fanout
        else tls_run "$TLS_PORT" fanout-tls --mode fanout --tls; fi
    done
    stop_roomcastd
done
for kind in plain tls; do
    start_roomcastd "$TCONF"
    log "idle: $kind, $IDLE_CONNECTIONS connections"
    if [ "$kind" = plain ]; then tls_run "$ROOMCAST_PORT" idle-plain --mode idle --connections "$IDLE_CONNECTIONS" --rss-steps 1000 --duration 10
    else tls_run "$TLS_PORT" idle-tls --mode idle --connections "$IDLE_CONNECTIONS" --rss-steps 1000 --duration 10 --tls; fi
    stop_roomcastd
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def runs(label): return [r for r in rows if r.get("label") == label]
def med(label, key):
    v = [r[key] for r in runs(label) if key in r]
    return statistics.median(v) if v else None
plain, tls = med("fanout-plain", "deliveries_per_s"), med("fanout-tls", "deliveries_per_s")
cut = sum(r.get("closed_by_server", 0) for r in rows)
print(f"fan-out, 1,000 members, 64 B, median of {len(runs('fanout-plain'))}: plain {plain:,.0f} deliveries/s, TLS {tls:,.0f} deliveries/s, "
      f"ratio {tls / plain:.2f}x (target >= 0.5x)")
print(f"  server CPU-second: plain {med('fanout-plain', 'deliveries_per_server_cpu_s') or 0:,.0f}, TLS {med('fanout-tls', 'deliveries_per_server_cpu_s') or 0:,.0f} deliveries")
ip, it = med("idle-plain", "rss_per_conn_bytes"), med("idle-tls", "rss_per_conn_bytes")
print(f"idle: RSS per connection: plain {ip / 1024:.1f} KiB, TLS {it / 1024:.1f} KiB (target < 20 KiB)")
print(f"connections closed by the server: {cut}")
PY
log "raw results: $OUT"
