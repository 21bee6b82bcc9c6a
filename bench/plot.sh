#!/usr/bin/env bash
# make bench-plot: the scaling curve of BENCHMARKS.md as bench/scaling.png.
#   - fan-out deliveries/s and p99 latency against room size (10 ... 10,000
#     members; 1 publisher, 64-byte text bodies, closed loop, window 64),
#     roomcastd, the C relay bench/ltb-relay.c and Redis;
#   - server RSS against idle connection count (up to 19,000).
# Redis when redis-server is there. About 5 minutes plus the build.
#   SIZES="10 100 1000" bench/plot.sh     other room sizes
source "$(dirname "$0")/lib.sh"

SIZES=${SIZES:-10 30 100 300 1000 3000 10000}
RSS_STEPS=${RSS_STEPS:-1000,2000,5000,10000,15000,19000}
DURATION=${DURATION:-4}

command -v gnuplot >/dev/null || {
    log "gnuplot is missing: apt-get install -y gnuplot-nox"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >&2 \
        || { $SUDO apt-get update -q >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >&2; }
}
build
mkdir -p "$RESULTS"
TARGETS=(roomcast)
ensure_redis && TARGETS+=(redis)

OUT=$RESULTS/scaling.jsonl
machine_json >"$OUT"

# RSS first, on fresh servers (their RSS before is the baseline).
start_roomcastd
[[ " ${TARGETS[*]} " == *" redis "* ]] && start_redis
for t in "${TARGETS[@]}"; do
    log "RSS: $t"
    bench_run "$t" --mode idle --rss-steps "$RSS_STEPS" --duration 1 --label rss >>"$OUT"
done
for n in $SIZES; do
    for t in "${TARGETS[@]}"; do
        log "fan-out to $n members: $t"
        bench_run "$t" --mode fanout --members "$n" --duration "$DURATION" --label "size-$n" >>"$OUT"
    done
done
stop_roomcastd
stop_redis

# The C relay (one room: the fan-out sweep only).
start_relay
for n in $SIZES; do
    log "fan-out to $n members: relay"
    bench_run relay --mode fanout --members "$n" --duration "$DURATION" --label "size-$n" >>"$OUT"
done
stop_relay

python3 - "$OUT" "$LOGDIR" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
d = sys.argv[2]
server = lambda r: r.get("server", r.get("target"))
for t in ("roomcast", "relay", "redis"):
    with open(f"{d}/fanout-{t}.dat", "w") as f:
        for r in runs:
            if server(r) == t and r.get("mode") == "fanout":
                f.write(f"{r['members']} {r['deliveries_per_s']} {r['lat_p99_us'] / 1000} {r.get('deliveries_per_server_cpu_s', 0)}\n")
    with open(f"{d}/rss-{t}.dat", "w") as f:
        for r in runs:
            if server(r) == t and r.get("mode") == "idle":
                f.write(f"0 {r['server_rss_before_kib'] / 1024}\n")
                for n, kib in zip(r["rss_steps"], r["rss_kib"]):
                    f.write(f"{n} {kib / 1024}\n")
PY

MACHINE=$(python3 -c "import json; m = json.loads(open('$OUT').readline()); print(f\"{m['nproc']} cores, {m['cpu']}, load avg {m['loadavg']}, {m['date']}\")")
gnuplot <<EOF
set terminal pngcairo size 1500,480 font "sans,10"
set output "$ROOT/bench/scaling.png"
set multiplot layout 1,3 title "roomcastd vs a minimal C relay and Redis pub/sub, loopback, server on core $SERVER_CPU, generator on core $GEN_CPU ($MACHINE)"
set grid
set key top left
set logscale x
set xlabel "room size (members)"
set ylabel "deliveries/s"
set format y "%.1s%c"
set title "fan-out throughput (1 publisher, 64 B, window 64)"
plot "$LOGDIR/fanout-roomcast.dat" using 1:2 with linespoints lw 2 lc rgb "#9400d3" title "roomcastd", \
     "$LOGDIR/fanout-relay.dat" using 1:2 with linespoints lw 2 lc rgb "#009e73" title "C relay", \
     "$LOGDIR/fanout-redis.dat" using 1:2 with linespoints lw 2 lc rgb "#56b4e9" title "Redis"
set logscale y
set format y "%g"
set ylabel "p99 latency (ms)"
set title "fan-out p99 latency (closed loop: grows with the window)"
plot "$LOGDIR/fanout-roomcast.dat" using 1:3 with linespoints lw 2 lc rgb "#9400d3" title "roomcastd", \
     "$LOGDIR/fanout-relay.dat" using 1:3 with linespoints lw 2 lc rgb "#009e73" title "C relay", \
     "$LOGDIR/fanout-redis.dat" using 1:3 with linespoints lw 2 lc rgb "#56b4e9" title "Redis"
unset logscale
set xlabel "idle connections"
set ylabel "server RSS (MiB)"
set format y "%g"
set key top left
set title "memory: RSS against idle connections (rooms of 100)"
plot "$LOGDIR/rss-roomcast.dat" using 1:2 with linespoints lw 2 lc rgb "#9400d3" title "roomcastd", \
     "$LOGDIR/rss-redis.dat" using 1:2 with linespoints lw 2 lc rgb "#56b4e9" title "Redis"
unset multiplot
EOF
log "wrote bench/scaling.png and $OUT"
